from pathlib import Path

EXPECTED = ['month,region,total,count', '2024-01,north,150.25,2', '2024-01,south,100.00,2', '2024-02,east,13.01,2', '2024-02,north,99.99,1', '2024-02,south,10.00,1', '2024-03,west,345.45,2']

def test_summary():
    lines = [l.strip() for l in Path("/app/summary.csv").read_text().splitlines() if l.strip()]
    assert lines == EXPECTED

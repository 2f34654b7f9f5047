from pathlib import Path

EXPECTED = ['200 8', '201 1', '301 1', '302 1', '404 3', '500 2', '503 1']

def test_counts():
    lines = [" ".join(l.split()) for l in Path("/app/status_counts.txt").read_text().splitlines() if l.strip()]
    assert lines == EXPECTED

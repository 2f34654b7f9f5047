from pathlib import Path

EXPECTED = ["name,total_score", "alice,15", "bob,15", "carol,15", "erin,3", "dave,0"]

def test_report():
    lines = [l.strip() for l in Path("/app/report.csv").read_text().splitlines() if l.strip()]
    assert lines == EXPECTED

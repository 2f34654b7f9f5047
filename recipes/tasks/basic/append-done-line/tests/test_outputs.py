from pathlib import Path

def test_appended():
    lines = [l for l in Path("/app/log.txt").read_text().splitlines() if l.strip()]
    assert lines[:3] == ["started", "working", "almost there"]
    assert len(lines) == 4
    assert lines[3].strip() == "done"

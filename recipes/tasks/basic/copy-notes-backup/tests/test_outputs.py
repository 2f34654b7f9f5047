from pathlib import Path

ORIGINAL = "buy milk\ncall Alice\nfix the bike\n"

def test_backup():
    assert Path("/app/notes.bak").read_text() == ORIGINAL

def test_original_kept():
    assert Path("/app/notes.txt").read_text() == ORIGINAL

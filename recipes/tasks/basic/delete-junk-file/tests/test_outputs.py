from pathlib import Path

def test_junk_removed():
    assert not Path("/app/junk.txt").exists(), "/app/junk.txt still exists"

def test_keep_intact():
    assert Path("/app/keep.txt").read_text() == "important data\n"

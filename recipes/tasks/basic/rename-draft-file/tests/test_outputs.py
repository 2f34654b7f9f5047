from pathlib import Path

def test_renamed():
    assert not Path("/app/draft.txt").exists(), "/app/draft.txt still exists"
    assert Path("/app/final.txt").read_text() == "Quarterly report\nStatus: approved\n"

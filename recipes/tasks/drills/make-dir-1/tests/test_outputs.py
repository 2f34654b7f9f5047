from pathlib import Path

def test_dir():
    assert Path('/app/staging').is_dir(), '/app/staging is not a directory'

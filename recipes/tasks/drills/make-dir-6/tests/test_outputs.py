from pathlib import Path

def test_dir():
    assert Path('/app/archive').is_dir(), '/app/archive is not a directory'

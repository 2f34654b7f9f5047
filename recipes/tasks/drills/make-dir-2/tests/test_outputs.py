from pathlib import Path

def test_dir():
    assert Path('/app/cache').is_dir(), '/app/cache is not a directory'

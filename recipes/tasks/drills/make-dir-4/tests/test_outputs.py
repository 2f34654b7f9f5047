from pathlib import Path

def test_dir():
    assert Path('/app/export/delta/raven').is_dir(), '/app/export/delta/raven is not a directory'

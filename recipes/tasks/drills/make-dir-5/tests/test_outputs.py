from pathlib import Path

def test_dir():
    assert Path('/app/staging/raven/saffron').is_dir(), '/app/staging/raven/saffron is not a directory'

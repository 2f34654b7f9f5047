from pathlib import Path

def test_empty():
    p = Path('/app/falcon.marker')
    assert p.is_file()
    assert p.stat().st_size == 0

from pathlib import Path

def test_empty():
    p = Path('/app/bravo.marker')
    assert p.is_file()
    assert p.stat().st_size == 0

from pathlib import Path

def test_output():
    p = Path('/app/source_49.txt')
    assert p.is_file(), '/app/source_49.txt is missing'
    assert p.read_text().strip() == 'raven'

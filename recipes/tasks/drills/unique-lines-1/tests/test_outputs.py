from pathlib import Path

def test_unique():
    assert Path('/app/catalog_57.txt').read_text().split() == ['ember', 'harbor', 'tundra']

from pathlib import Path

def test_grep():
    got = Path('/app/catalog_28.txt').read_text().splitlines()
    assert got == ['OK tundra 221', 'OK velvet 888']

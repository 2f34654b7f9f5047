from pathlib import Path

def test_grep():
    got = Path('/app/inventory_45.txt').read_text().splitlines()
    assert got == ['TODO lantern 582', 'TODO willow 124']

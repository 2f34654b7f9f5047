from pathlib import Path

def test_append():
    assert Path('/app/inventory_59.txt').read_text().splitlines() == ['willow maple 40', 'saffron orchid 364', 'maple saffron 130', 'saffron willow 286', 'nickel']

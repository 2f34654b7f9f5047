from pathlib import Path

def test_upper():
    assert Path('/app/items_79.txt').read_text().splitlines() == ['CEDAR MAPLE 531', 'KETTLE ALPHA 833', 'ZEPHYR CEDAR 107']

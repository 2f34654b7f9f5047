from pathlib import Path

def test_tail():
    assert Path('/app/items_50.txt').read_text().splitlines() == ['pepper umber 63']

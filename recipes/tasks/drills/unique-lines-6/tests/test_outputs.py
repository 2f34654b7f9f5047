from pathlib import Path

def test_unique():
    assert Path('/app/inventory_45.txt').read_text().split() == ['delta', 'indigo', 'velvet']

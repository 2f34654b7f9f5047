from pathlib import Path

def test_unique():
    assert Path('/app/catalog_80.txt').read_text().split() == ['cedar', 'delta', 'falcon', 'raven', 'saffron']

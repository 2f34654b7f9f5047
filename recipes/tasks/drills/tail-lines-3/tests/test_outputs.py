from pathlib import Path

def test_tail():
    assert Path('/app/inventory_31.txt').read_text().splitlines() == ['alpha copper 918', 'falcon yarrow 807', 'maple velvet 575', 'falcon willow 81']

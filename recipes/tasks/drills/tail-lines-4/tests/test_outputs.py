from pathlib import Path

def test_tail():
    assert Path('/app/items_42.txt').read_text().splitlines() == ['harbor quartz 365', 'falcon yarrow 772', 'meadow kettle 277', 'copper pepper 968', 'meadow alpha 319']

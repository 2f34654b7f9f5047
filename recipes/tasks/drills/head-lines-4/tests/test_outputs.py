from pathlib import Path

def test_head():
    assert Path('/app/manifest_64.txt').read_text().splitlines() == ['bravo delta 394', 'umber indigo 122', 'yarrow saffron 368', 'harbor velvet 734', 'willow raven 677']

from pathlib import Path

def test_output():
    p = Path('/app/inventory_17.txt')
    assert p.is_file(), '/app/inventory_17.txt is missing'
    assert p.read_text().strip() == '9'

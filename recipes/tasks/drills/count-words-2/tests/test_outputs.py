from pathlib import Path

def test_output():
    p = Path('/app/inventory_77.txt')
    assert p.is_file(), '/app/inventory_77.txt is missing'
    assert p.read_text().strip() == '12'

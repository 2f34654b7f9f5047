from pathlib import Path

def test_output():
    p = Path('/app/items_18.txt')
    assert p.is_file(), '/app/items_18.txt is missing'
    assert p.read_text().strip() == '9'

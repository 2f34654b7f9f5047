from pathlib import Path

def test_output():
    p = Path('/app/table_84.txt')
    assert p.is_file(), '/app/table_84.txt is missing'
    assert p.read_text().strip() == 'pepper'

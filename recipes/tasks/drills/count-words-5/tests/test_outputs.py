from pathlib import Path

def test_output():
    p = Path('/app/records_96.txt')
    assert p.is_file(), '/app/records_96.txt is missing'
    assert p.read_text().strip() == '12'

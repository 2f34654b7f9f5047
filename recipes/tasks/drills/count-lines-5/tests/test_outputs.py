from pathlib import Path

def test_output():
    p = Path('/app/roster_60.txt')
    assert p.is_file(), '/app/roster_60.txt is missing'
    assert p.read_text().strip() == '12'

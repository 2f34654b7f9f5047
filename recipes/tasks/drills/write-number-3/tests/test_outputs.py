from pathlib import Path

def test_output():
    p = Path('/app/roster_66.txt')
    assert p.is_file(), '/app/roster_66.txt is missing'
    assert p.read_text().strip() == '9054'

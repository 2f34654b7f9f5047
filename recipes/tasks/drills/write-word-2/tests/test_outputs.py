from pathlib import Path

def test_output():
    p = Path('/app/roster_61.txt')
    assert p.is_file(), '/app/roster_61.txt is missing'
    assert p.read_text().strip() == 'quartz'

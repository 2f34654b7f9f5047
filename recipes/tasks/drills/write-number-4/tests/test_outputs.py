from pathlib import Path

def test_output():
    p = Path('/app/input_21.txt')
    assert p.is_file(), '/app/input_21.txt is missing'
    assert p.read_text().strip() == '1022'

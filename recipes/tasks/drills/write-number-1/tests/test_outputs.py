from pathlib import Path

def test_output():
    p = Path('/app/sample_70.txt')
    assert p.is_file(), '/app/sample_70.txt is missing'
    assert p.read_text().strip() == '1210'

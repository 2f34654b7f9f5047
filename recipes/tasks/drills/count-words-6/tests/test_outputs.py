from pathlib import Path

def test_output():
    p = Path('/app/sample_23.txt')
    assert p.is_file(), '/app/sample_23.txt is missing'
    assert p.read_text().strip() == '24'

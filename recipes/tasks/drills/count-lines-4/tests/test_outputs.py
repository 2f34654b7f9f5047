from pathlib import Path

def test_output():
    p = Path('/app/sample_25.txt')
    assert p.is_file(), '/app/sample_25.txt is missing'
    assert p.read_text().strip() == '19'

from pathlib import Path

def test_output():
    p = Path('/app/sample_51.txt')
    assert p.is_file(), '/app/sample_51.txt is missing'
    assert p.read_text().strip() == '5'

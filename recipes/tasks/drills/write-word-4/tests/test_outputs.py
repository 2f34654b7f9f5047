from pathlib import Path

def test_output():
    p = Path('/app/source_46.txt')
    assert p.is_file(), '/app/source_46.txt is missing'
    assert p.read_text().strip() == 'quartz'

from pathlib import Path

def test_output():
    p = Path('/app/entries_89.txt')
    assert p.is_file(), '/app/entries_89.txt is missing'
    assert p.read_text().strip() == 'zephyr'

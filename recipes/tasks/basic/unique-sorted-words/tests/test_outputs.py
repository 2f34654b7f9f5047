from pathlib import Path

EXPECTED = ['apple', 'banana', 'cherry', 'date', 'fig', 'kiwi', 'pear']

def test_unique():
    p = Path("/app/unique.txt")
    assert p.is_file(), "/app/unique.txt does not exist"
    lines = [l.strip() for l in p.read_text().splitlines() if l.strip()]
    assert lines == EXPECTED

from pathlib import Path

EXPECTED = ['Ava', 'Benjamin', 'Charlotte', 'Elijah', 'Emma', 'James', 'Liam', 'Lucas', 'Mia', 'Noah', 'Olivia', 'Sophia']

def test_sorted():
    p = Path("/app/sorted.txt")
    assert p.is_file(), "/app/sorted.txt does not exist"
    lines = [l.strip() for l in p.read_text().splitlines() if l.strip()]
    assert lines == EXPECTED

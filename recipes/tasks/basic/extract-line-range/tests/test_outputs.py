from pathlib import Path

EXPECTED = ['A sparrow sang upon the wire,', 'the baker lit his early fire,', 'the milkman whistled down the lane,']

def test_excerpt():
    p = Path("/app/excerpt.txt")
    assert p.is_file(), "/app/excerpt.txt does not exist"
    lines = [l.rstrip() for l in p.read_text().splitlines() if l.strip()]
    assert lines == EXPECTED

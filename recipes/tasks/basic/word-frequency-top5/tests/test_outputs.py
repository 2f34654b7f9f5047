from pathlib import Path

EXPECTED = ['the 10', 'dog 6', 'fox 5', 'is 4', 'quick 3']

def test_top5():
    lines = [" ".join(l.split()) for l in Path("/app/top5.txt").read_text().splitlines() if l.strip()]
    assert lines == EXPECTED

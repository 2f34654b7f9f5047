from pathlib import Path

def test_two_lines():
    p = Path("/app/greeting.txt")
    assert p.is_file(), "/app/greeting.txt does not exist"
    lines = [line.strip() for line in p.read_text().strip().splitlines()]
    assert lines == ["hello", "world"]

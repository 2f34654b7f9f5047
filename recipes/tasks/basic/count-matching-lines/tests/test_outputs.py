from pathlib import Path

def test_count():
    p = Path("/app/apple_count.txt")
    assert p.is_file(), "/app/apple_count.txt does not exist"
    assert p.read_text().strip() == "5"

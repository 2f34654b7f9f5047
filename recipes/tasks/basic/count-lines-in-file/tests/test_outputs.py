from pathlib import Path

def test_count():
    p = Path("/app/count.txt")
    assert p.is_file(), "/app/count.txt does not exist"
    assert p.read_text().strip() == "17"

from pathlib import Path

def test_largest():
    p = Path("/app/largest.txt")
    assert p.is_file(), "/app/largest.txt does not exist"
    assert p.read_text().strip().removeprefix("./") == "delta.bin"

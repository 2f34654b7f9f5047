from pathlib import Path

def test_sum():
    p = Path("/app/sum.txt")
    assert p.is_file(), "/app/sum.txt does not exist"
    assert p.read_text().strip() == "1416"

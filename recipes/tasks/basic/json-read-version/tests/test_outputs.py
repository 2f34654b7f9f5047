from pathlib import Path

def test_version():
    p = Path("/app/version.txt")
    assert p.is_file(), "/app/version.txt does not exist"
    assert p.read_text().strip().strip('"') == "2.7.1"

from pathlib import Path

def test_flag():
    p = Path("/app/ready.flag")
    assert p.is_file(), "/app/ready.flag does not exist"
    assert p.read_text().strip() == "", "ready.flag should be empty"

from pathlib import Path

def test_hello_file():
    p = Path("/app/hello.txt")
    assert p.is_file(), "/app/hello.txt does not exist"
    assert p.read_text().strip() == "hello"

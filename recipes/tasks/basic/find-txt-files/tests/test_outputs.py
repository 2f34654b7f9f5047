from pathlib import Path

EXPECTED = ['api/endpoints.txt', 'notes/2024/january.txt', 'notes/todo.txt', 'readme.txt']

def test_found():
    p = Path("/app/found.txt")
    assert p.is_file(), "/app/found.txt does not exist"
    lines = [l.strip().removeprefix("./") for l in p.read_text().splitlines() if l.strip()]
    assert lines == EXPECTED

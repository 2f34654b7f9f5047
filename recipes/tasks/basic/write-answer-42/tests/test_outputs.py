from pathlib import Path

def test_answer():
    p = Path("/app/answer.txt")
    assert p.is_file(), "/app/answer.txt does not exist"
    assert p.read_text().strip() == "42"

from pathlib import Path

EXPECTED = ['ana@example.com', 'bo.chen@example.org', 'carla@example.net', 'dev@example.com', 'eve.s@example.com']

def test_emails():
    p = Path("/app/emails.txt")
    assert p.is_file(), "/app/emails.txt does not exist"
    lines = [l.strip() for l in p.read_text().splitlines() if l.strip()]
    assert lines == EXPECTED

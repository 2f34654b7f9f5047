from pathlib import Path

EXPECTED = ['2024-05-01 10:01:12 ERROR failed to load user 42: not found', '2024-05-01 10:03:02 ERROR timeout while calling payment service', '2024-05-01 10:05:59 ERROR disk usage above 90%']

def test_errors():
    p = Path("/app/errors.txt")
    assert p.is_file(), "/app/errors.txt does not exist"
    lines = [l.rstrip() for l in p.read_text().splitlines() if l.strip()]
    assert lines == EXPECTED

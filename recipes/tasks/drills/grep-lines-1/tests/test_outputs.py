from pathlib import Path

def test_grep():
    got = Path('/app/notes_a_86.txt').read_text().splitlines()
    assert got == ['WARN cedar 812', 'WARN zephyr 168']

from pathlib import Path

def test_grep():
    got = Path('/app/notes_a_85.txt').read_text().splitlines()
    assert got == ['WARN bravo 240', 'WARN falcon 239']

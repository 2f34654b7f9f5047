from pathlib import Path

def test_append():
    assert Path('/app/notes_a_31.txt').read_text().splitlines() == ['nickel umber 405', 'orchid']

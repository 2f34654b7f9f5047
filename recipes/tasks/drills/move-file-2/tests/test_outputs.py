from pathlib import Path

def test_move():
    assert not Path('/app/entries_43.txt').exists()
    assert Path('/app/records_38.txt').read_text() == 'cedar umber 309\nlantern nickel 185\n'

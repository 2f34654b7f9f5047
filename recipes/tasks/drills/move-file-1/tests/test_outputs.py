from pathlib import Path

def test_move():
    assert not Path('/app/notes_a_33.txt').exists()
    assert Path('/app/entries_71.txt').read_text() == 'garnet yarrow 820\nbravo velvet 24\n'

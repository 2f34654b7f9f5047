from pathlib import Path

def test_copy():
    assert Path('/app/input_25.txt').read_text() == 'maple saffron 123\nmeadow cedar 380\nmaple delta 38\n'
    assert Path('/app/notes_a_87.txt').read_text() == 'maple saffron 123\nmeadow cedar 380\nmaple delta 38\n'

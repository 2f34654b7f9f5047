from pathlib import Path

def test_copy():
    assert Path('/app/manifest_40.txt').read_text() == 'saffron maple 973\nnickel saffron 282\norchid pepper 677\n'
    assert Path('/app/notes_a_96.txt').read_text() == 'saffron maple 973\nnickel saffron 282\norchid pepper 677\n'

from pathlib import Path

def test_delete():
    assert not Path('/app/input_86.txt').exists()
    assert Path('/app/notes_a_99.txt').is_file()

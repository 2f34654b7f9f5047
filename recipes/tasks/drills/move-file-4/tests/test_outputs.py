from pathlib import Path

def test_move():
    assert not Path('/app/list_99.txt').exists()
    assert Path('/app/notes_a_17.txt').read_text() == 'copper velvet 163\nfalcon kettle 543\n'

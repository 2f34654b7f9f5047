from pathlib import Path

def test_move():
    assert not Path('/app/manifest_69.txt').exists()
    assert Path('/app/items_86.txt').read_text() == 'delta willow 401\ngarnet indigo 368\n'

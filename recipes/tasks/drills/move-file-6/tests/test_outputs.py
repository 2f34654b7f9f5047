from pathlib import Path

def test_move():
    assert not Path('/app/table_59.txt').exists()
    assert Path('/app/batch_29.txt').read_text() == 'raven willow 13\norchid yarrow 81\n'

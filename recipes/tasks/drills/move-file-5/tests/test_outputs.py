from pathlib import Path

def test_move():
    assert not Path('/app/entries_86.txt').exists()
    assert Path('/app/ledger_95.txt').read_text() == 'falcon alpha 483\nvelvet nickel 922\n'

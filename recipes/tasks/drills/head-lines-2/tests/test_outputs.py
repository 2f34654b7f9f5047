from pathlib import Path

def test_head():
    assert Path('/app/roster_66.txt').read_text().splitlines() == ['bravo copper 423', 'pepper orchid 451']

from pathlib import Path

def test_head():
    assert Path('/app/input_77.txt').read_text().splitlines() == ['tundra lantern 501', 'orchid juniper 13', 'harbor raven 669']

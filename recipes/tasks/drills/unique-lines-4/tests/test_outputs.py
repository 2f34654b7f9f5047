from pathlib import Path

def test_unique():
    assert Path('/app/ledger_36.txt').read_text().split() == ['cedar', 'copper', 'falcon', 'juniper', 'pepper']

from pathlib import Path

def test_unique():
    assert Path('/app/ledger_53.txt').read_text().split() == ['cedar', 'lantern', 'orchid', 'umber']

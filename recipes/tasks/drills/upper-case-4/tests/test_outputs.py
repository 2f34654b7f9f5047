from pathlib import Path

def test_upper():
    assert Path('/app/ledger_29.txt').read_text().splitlines() == ['ZEPHYR ORCHID 566', 'EMBER BRAVO 648', 'SAFFRON FALCON 657']

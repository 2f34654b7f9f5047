from pathlib import Path

def test_upper():
    assert Path('/app/batch_62.txt').read_text().splitlines() == ['VELVET EMBER 610', 'EMBER MEADOW 888', 'JUNIPER QUARTZ 62']

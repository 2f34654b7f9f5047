from pathlib import Path

def test_unique():
    assert Path('/app/records_99.txt').read_text().split() == ['ember', 'juniper', 'nickel']

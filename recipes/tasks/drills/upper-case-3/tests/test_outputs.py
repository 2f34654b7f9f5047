from pathlib import Path

def test_upper():
    assert Path('/app/records_20.txt').read_text().splitlines() == ['RAVEN FALCON 833', 'INDIGO GARNET 820', 'INDIGO KETTLE 718']

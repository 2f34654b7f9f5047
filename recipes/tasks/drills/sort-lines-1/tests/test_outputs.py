from pathlib import Path

def test_sorted():
    assert Path('/app/entries_76.txt').read_text().split() == ['bravo', 'copper', 'lantern', 'meadow', 'orchid']

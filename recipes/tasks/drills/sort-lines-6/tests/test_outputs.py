from pathlib import Path

def test_sorted():
    assert Path('/app/report_56.txt').read_text().split() == ['alpha', 'ember', 'garnet', 'tundra']

from pathlib import Path

def test_sorted():
    assert Path('/app/records_15.txt').read_text().split() == ['alpha', 'indigo', 'pepper', 'quartz']

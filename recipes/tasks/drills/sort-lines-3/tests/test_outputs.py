from pathlib import Path

def test_sorted():
    assert Path('/app/manifest_99.txt').read_text().split() == ['delta', 'ember', 'juniper', 'maple', 'nickel', 'quartz', 'saffron', 'velvet']

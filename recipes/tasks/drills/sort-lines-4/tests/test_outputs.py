from pathlib import Path

def test_sorted():
    assert Path('/app/records_22.txt').read_text().split() == ['alpha', 'ember', 'nickel', 'orchid', 'velvet', 'yarrow', 'zephyr']

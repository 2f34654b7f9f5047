from pathlib import Path

def test_sorted():
    assert Path('/app/batch_20.txt').read_text().split() == ['alpha', 'cedar', 'delta', 'lantern', 'willow', 'zephyr']

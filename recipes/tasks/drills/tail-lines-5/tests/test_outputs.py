from pathlib import Path

def test_tail():
    assert Path('/app/batch_97.txt').read_text().splitlines() == ['zephyr garnet 781', 'quartz quartz 349', 'meadow maple 996']

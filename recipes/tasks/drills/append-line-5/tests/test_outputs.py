from pathlib import Path

def test_append():
    assert Path('/app/batch_65.txt').read_text().splitlines() == ['tundra kettle 93', 'juniper alpha 505', 'alpha zephyr 257', 'zephyr']

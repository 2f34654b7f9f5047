from pathlib import Path

def test_sed():
    assert Path('/app/batch_49.cfg').read_text().splitlines() == ['alpha = 7', 'name zephyr', '# alpha again alpha']

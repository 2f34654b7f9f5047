from pathlib import Path

def test_sed():
    assert Path('/app/queue_28.cfg').read_text().splitlines() == ['zephyr = 9', 'name ember', '# zephyr again zephyr']

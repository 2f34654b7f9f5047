from pathlib import Path

def test_sed():
    assert Path('/app/manifest_90.cfg').read_text().splitlines() == ['raven = 7', 'name zephyr', '# raven again raven']

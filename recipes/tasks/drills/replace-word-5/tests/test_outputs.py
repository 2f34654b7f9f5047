from pathlib import Path

def test_sed():
    assert Path('/app/batch_78.cfg').read_text().splitlines() == ['raven = 6', 'name kettle', '# raven again raven']

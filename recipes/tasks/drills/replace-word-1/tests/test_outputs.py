from pathlib import Path

def test_sed():
    assert Path('/app/batch_88.cfg').read_text().splitlines() == ['cedar = 9', 'name nickel', '# cedar again cedar']

from pathlib import Path

def test_sed():
    assert Path('/app/list_77.cfg').read_text().splitlines() == ['cedar = 3', 'name saffron', '# cedar again cedar']

from pathlib import Path

def test_delete():
    assert not Path('/app/roster_55.txt').exists()
    assert Path('/app/catalog_96.txt').is_file()

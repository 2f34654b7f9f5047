from pathlib import Path

def test_delete():
    assert not Path('/app/source_49.txt').exists()
    assert Path('/app/inventory_63.txt').is_file()

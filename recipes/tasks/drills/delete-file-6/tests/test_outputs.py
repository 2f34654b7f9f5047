from pathlib import Path

def test_delete():
    assert not Path('/app/inventory_96.txt').exists()
    assert Path('/app/queue_14.txt').is_file()

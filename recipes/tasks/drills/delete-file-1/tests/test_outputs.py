from pathlib import Path

def test_delete():
    assert not Path('/app/items_79.txt').exists()
    assert Path('/app/batch_27.txt').is_file()

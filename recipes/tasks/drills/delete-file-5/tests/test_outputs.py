from pathlib import Path

def test_delete():
    assert not Path('/app/list_40.txt').exists()
    assert Path('/app/report_91.txt').is_file()

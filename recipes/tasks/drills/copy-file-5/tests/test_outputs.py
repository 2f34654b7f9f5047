from pathlib import Path

def test_copy():
    assert Path('/app/table_31.txt').read_text() == 'maple bravo 104\ncopper ember 876\nwillow harbor 47\n'
    assert Path('/app/sample_64.txt').read_text() == 'maple bravo 104\ncopper ember 876\nwillow harbor 47\n'

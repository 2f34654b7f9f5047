from pathlib import Path

def test_copy():
    assert Path('/app/records_51.txt').read_text() == 'saffron umber 344\ngarnet harbor 17\nyarrow indigo 120\n'
    assert Path('/app/entries_72.txt').read_text() == 'saffron umber 344\ngarnet harbor 17\nyarrow indigo 120\n'

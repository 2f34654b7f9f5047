from pathlib import Path

def test_copy():
    assert Path('/app/records_96.txt').read_text() == 'bravo maple 83\nwillow maple 554\nvelvet meadow 858\n'
    assert Path('/app/source_29.txt').read_text() == 'bravo maple 83\nwillow maple 554\nvelvet meadow 858\n'

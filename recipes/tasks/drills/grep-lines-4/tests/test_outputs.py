from pathlib import Path

def test_grep():
    got = Path('/app/input_44.txt').read_text().splitlines()
    assert got == ['TODO harbor 145', 'TODO juniper 196', 'TODO delta 445', 'TODO orchid 734']

from pathlib import Path

def test_output():
    p = Path('/app/notes_a_48.txt')
    assert p.is_file(), '/app/notes_a_48.txt is missing'
    assert p.read_text().strip() == '12'

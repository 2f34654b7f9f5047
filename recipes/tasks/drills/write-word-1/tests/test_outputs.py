from pathlib import Path

def test_output():
    p = Path('/app/queue_15.txt')
    assert p.is_file(), '/app/queue_15.txt is missing'
    assert p.read_text().strip() == 'meadow'

from pathlib import Path

def test_output():
    p = Path('/app/queue_71.txt')
    assert p.is_file(), '/app/queue_71.txt is missing'
    assert p.read_text().strip() == '15'

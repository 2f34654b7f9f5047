from pathlib import Path

def test_output():
    p = Path('/app/queue_50.txt')
    assert p.is_file(), '/app/queue_50.txt is missing'
    assert p.read_text().strip() == '5798'

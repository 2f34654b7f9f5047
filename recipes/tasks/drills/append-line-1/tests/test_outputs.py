from pathlib import Path

def test_append():
    assert Path('/app/table_69.txt').read_text().splitlines() == ['umber tundra 818', 'copper zephyr 234', 'alpha lantern 542', 'falcon velvet 200', 'bravo']

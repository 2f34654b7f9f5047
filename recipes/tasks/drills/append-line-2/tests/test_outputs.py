from pathlib import Path

def test_append():
    assert Path('/app/roster_12.txt').read_text().splitlines() == ['saffron harbor 282', 'falcon zephyr 949', 'yarrow']

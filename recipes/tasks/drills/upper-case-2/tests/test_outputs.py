from pathlib import Path

def test_upper():
    assert Path('/app/roster_92.txt').read_text().splitlines() == ['WILLOW ZEPHYR 741', 'BRAVO YARROW 844', 'QUARTZ BRAVO 844']

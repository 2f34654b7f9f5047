from pathlib import Path

def test_head():
    assert Path('/app/sample_65.txt').read_text().splitlines() == ['delta raven 922', 'juniper tundra 555']

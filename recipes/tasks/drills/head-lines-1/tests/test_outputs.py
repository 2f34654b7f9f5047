from pathlib import Path

def test_head():
    assert Path('/app/sample_78.txt').read_text().splitlines() == ['orchid kettle 262', 'alpha quartz 46', 'garnet lantern 83']

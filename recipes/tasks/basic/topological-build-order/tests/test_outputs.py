from pathlib import Path

EXPECTED = ['config', 'core', 'fixtures', 'utils', 'lib', 'app', 'cli', 'docs', 'tests']

def test_order():
    lines = [l.strip() for l in Path("/app/order.txt").read_text().splitlines() if l.strip()]
    assert lines == EXPECTED

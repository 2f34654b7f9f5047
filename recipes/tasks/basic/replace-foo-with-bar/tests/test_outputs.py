from pathlib import Path

EXPECTED = '# service configuration\nname = bar-service\nhost = bar.internal\nport = 8080\nbackend = bar\n# bar is the old name\ntimeout = 30\n'

def test_replaced():
    assert Path("/app/config.txt").read_text() == EXPECTED

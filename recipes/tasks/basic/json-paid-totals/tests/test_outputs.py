import json
from pathlib import Path

EXPECTED = {'acme': 150.75, 'initech': 410.1, 'globex': 100.0}

def test_totals():
    data = json.loads(Path("/app/totals.json").read_text())
    assert isinstance(data, dict)
    assert sorted(data) == sorted(EXPECTED)
    for name, total in EXPECTED.items():
        assert abs(float(data[name]) - total) < 0.005, (name, data[name], total)

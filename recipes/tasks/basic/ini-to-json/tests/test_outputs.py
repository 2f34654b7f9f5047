import json
from pathlib import Path

EXPECTED = {'server': {'host': '0.0.0.0', 'port': '8000', 'workers': '4'}, 'database': {'url': 'postgres://db:5432/app', 'pool_size': '10'}, 'features': {'signup': 'enabled', 'beta_banner': 'disabled'}}

def test_json():
    assert json.loads(Path("/app/settings.json").read_text()) == EXPECTED

from pathlib import Path

import subprocess

def test_prints():
    out = subprocess.run(['python3', '/app/cedar.py'], capture_output=True, text=True)
    assert out.stdout.strip() == 'garnet willow'

from pathlib import Path

import subprocess

def test_prints():
    out = subprocess.run(['python3', '/app/velvet.py'], capture_output=True, text=True)
    assert out.stdout.strip() == 'raven pepper'

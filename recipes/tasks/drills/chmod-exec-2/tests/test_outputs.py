from pathlib import Path

import os

def test_exec():
    assert os.access('/app/copper.sh', os.X_OK)
    assert Path('/app/copper.sh').read_text() == 'echo hi\n'

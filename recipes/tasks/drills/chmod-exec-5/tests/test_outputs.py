from pathlib import Path

import os

def test_exec():
    assert os.access('/app/kettle.sh', os.X_OK)
    assert Path('/app/kettle.sh').read_text() == 'echo hi\n'

from pathlib import Path

import os

def test_exec():
    assert os.access('/app/falcon.sh', os.X_OK)
    assert Path('/app/falcon.sh').read_text() == 'echo hi\n'

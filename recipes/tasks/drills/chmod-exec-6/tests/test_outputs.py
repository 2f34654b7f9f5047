from pathlib import Path

import os

def test_exec():
    assert os.access('/app/yarrow.sh', os.X_OK)
    assert Path('/app/yarrow.sh').read_text() == 'echo hi\n'

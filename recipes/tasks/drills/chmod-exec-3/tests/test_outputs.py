from pathlib import Path

import os

def test_exec():
    assert os.access('/app/saffron.sh', os.X_OK)
    assert Path('/app/saffron.sh').read_text() == 'echo hi\n'

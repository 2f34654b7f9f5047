from pathlib import Path

import os

def test_exec():
    assert os.access('/app/orchid.sh', os.X_OK)
    assert Path('/app/orchid.sh').read_text() == 'echo hi\n'

import os
import stat

def test_mode():
    mode = stat.S_IMODE(os.stat("/app/secret.txt").st_mode)
    assert mode == 0o600, oct(mode)

def test_content():
    with open("/app/secret.txt") as f:
        assert f.read() == "api_key=not-a-real-key\n"

from pathlib import Path

def test_out_dir():
    assert Path("/app/out").is_dir(), "/app/out is not a directory"

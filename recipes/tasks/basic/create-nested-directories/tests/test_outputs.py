from pathlib import Path

def test_nested():
    assert Path("/app/a/b/c").is_dir(), "/app/a/b/c is not a directory"

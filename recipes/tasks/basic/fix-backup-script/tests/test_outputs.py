import subprocess
from pathlib import Path


def run(src, dest):
    return subprocess.run(["bash", "/app/backup.sh", str(src), str(dest)], capture_output=True,
                          text=True, timeout=20)


def test_simple(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("A")
    (src / "b.log").write_text("B")
    res = run(src, tmp_path / "dst")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "dst" / "a.txt.bak").read_text() == "A"
    assert not (tmp_path / "dst" / "b.log.bak").exists()


def test_spaces(tmp_path):
    src = tmp_path / "my documents"
    src.mkdir()
    (src / "to do.txt").write_text("list")
    (src / "plain.txt").write_text("plain")
    dest = tmp_path / "back up"
    res = run(src, dest)
    assert res.returncode == 0, res.stderr
    assert (dest / "to do.txt.bak").read_text() == "list"
    assert (dest / "plain.txt.bak").read_text() == "plain"
    assert sorted(p.name for p in dest.iterdir()) == ["plain.txt.bak", "to do.txt.bak"]


def test_no_txt_files(tmp_path):
    src = tmp_path / "empty dir"
    src.mkdir()
    res = run(src, tmp_path / "out dir")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "out dir").is_dir()
    assert list((tmp_path / "out dir").iterdir()) == []

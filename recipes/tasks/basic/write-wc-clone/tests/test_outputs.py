import subprocess

FILES = {'a.txt': 'hello world\nsecond line here\n', 'b.txt': 'one\ntwo\nthree\n\nfive words in this line\n', 'c.txt': 'no newline at end'}


def counts(text):
    return text.count("\n"), len(text.split()), len(text.encode())


def run(*args):
    return subprocess.run(["python3", "/app/mywc.py", *args], capture_output=True, text=True,
                          timeout=20, cwd="/tmp")


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_bytes(text.encode())
    return str(p)


def test_single(tmp_path):
    path = write(tmp_path, "a.txt", FILES["a.txt"])
    res = run(path)
    assert res.returncode == 0, res.stderr
    l, w, b = counts(FILES["a.txt"])
    assert res.stdout.strip().splitlines() == [f"{l} {w} {b} {path}"]


def test_multiple_with_total(tmp_path):
    paths, expected, tot = [], [], [0, 0, 0]
    for name, text in FILES.items():
        path = write(tmp_path, name, text)
        paths.append(path)
        l, w, b = counts(text)
        expected.append(f"{l} {w} {b} {path}")
        tot = [tot[0] + l, tot[1] + w, tot[2] + b]
    expected.append(f"{tot[0]} {tot[1]} {tot[2]} total")
    res = run(*paths)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines() == expected


def test_unicode_bytes(tmp_path):
    path = write(tmp_path, "u.txt", "caf\u00e9 na\u00efve\n")
    res = run(path)
    assert res.stdout.strip() == f"1 2 13 {path}"


def test_missing_file(tmp_path):
    good = write(tmp_path, "b.txt", FILES["b.txt"])
    missing = str(tmp_path / "nope.txt")
    res = run(missing, good)
    assert res.returncode == 1
    assert res.stderr.strip() != ""
    l, w, b = counts(FILES["b.txt"])
    assert res.stdout.strip().splitlines() == [f"{l} {w} {b} {good}", f"{l} {w} {b} total"]

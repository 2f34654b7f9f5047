import subprocess


def expected(n):
    out = []
    for i in range(1, n + 1):
        out.append("FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else str(i))
    return out


def run(n):
    res = subprocess.run(["python3", "/app/fizzbuzz.py", str(n)], capture_output=True, text=True, timeout=10)
    assert res.returncode == 0, res.stderr
    return [l.strip() for l in res.stdout.splitlines() if l.strip()]


def test_15():
    assert run(15) == expected(15)

def test_100():
    assert run(100) == expected(100)

def test_small():
    assert run(1) == ["1"]
    assert run(0) == []

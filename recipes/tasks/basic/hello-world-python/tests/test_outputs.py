import subprocess

def test_output():
    out = subprocess.run(["python3", "/app/hello.py"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Hello, World!"

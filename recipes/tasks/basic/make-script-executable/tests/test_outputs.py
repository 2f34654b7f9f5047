import os
import subprocess

def test_executable():
    assert os.access("/app/run.sh", os.X_OK), "/app/run.sh is not executable"

def test_runs():
    out = subprocess.run(["/app/run.sh"], capture_output=True, text=True, timeout=10)
    assert out.stdout.strip() == "ok"

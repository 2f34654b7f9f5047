"""Launch a real SGLang server as a child process (GPU machines with the optional ``sglang``
extra) and wait for ``/health``; without SGLang, an :class:`EngineError` saying what to install.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from stacx.bus.server import free_port
from stacx.errors import EngineError


@dataclass
class SGLangServer:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float, log: Path) -> None:
    """Poll ``url/health`` until it answers 200; fail early if the process exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise EngineError(f"server exited with code {process.returncode}; log {log}:\n{tail}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url + "/health", timeout=2) as r:
            if r.status == 200:
                return
        time.sleep(0.5)
    process.kill()
    raise EngineError(f"server at {url} not healthy after {timeout_s:.0f}s; log {log}")


def start_sglang_server(
    model: str,
    port: int | None = None,
    *,
    host: str = "127.0.0.1",
    extra_args: tuple[str, ...] = (),
    timeout_s: float = 900.0,
    log_dir: str | os.PathLike[str] | None = None,
) -> SGLangServer:
    """Start SGLang on `model` (an HF directory or hub id) and wait until it is healthy."""
    if importlib.util.find_spec("sglang") is None:
        raise EngineError(
            "SGLang is not installed: `pip install 'stacx[sglang]'` on a GPU machine, "
            "or use `stacx serve` (the in-process engine behind the same API)"
        )
    port = port or free_port()
    log = Path(log_dir or ".") / f"sglang-{port}.log"
    cmd = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        model,
        "--host",
        host,
        "--port",
        str(port),
        *extra_args,
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://{host}:{port}"
    wait_healthy(url, proc, timeout_s, log)
    return SGLangServer(proc, url, log)

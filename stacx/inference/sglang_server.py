"""Launch a real SGLang server (GPU machines with the optional ``sglang`` extra).

``start_sglang_server`` runs ``python -m sglang.launch_server`` as a child process and returns
once ``GET /health`` answers; talk to it with :class:`~stacx.inference.sglang_client.SGLangEngine`.
On machines without SGLang (this CPU box) it raises an :class:`EngineError` that says what to
install; `stacx serve` is the CPU stand-in speaking the same native API.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

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

    def __enter__(self) -> SGLangServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float, log: Path) -> None:
    """Poll ``url/health`` until it answers 200; fail early if the process exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise EngineError(f"server exited with code {process.returncode}; log {log}:\n{tail}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
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
    port = port or free_port(host)
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

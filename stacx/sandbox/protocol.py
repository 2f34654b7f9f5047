"""The Sandbox port: a place where an agent's actions run, with limits.

Backends (Docker through aiodocker is the one shipped) implement this Protocol and pass
tests/sandbox/test_sandbox_contract.py. A sandbox is not a security boundary against a
determined attacker on a shared kernel; it contains the failures an agent causes by accident
(fork bombs, runaway memory, infinite loops, floods of output, network use where forbidden).
"""

from __future__ import annotations

from types import TracebackType
from typing import Protocol, Self

import msgspec


class ExecResult(msgspec.Struct, frozen=True, kw_only=True):
    exit_code: int | None  # None when the command was killed (timeout) before it exited
    stdout: str
    stderr: str
    timed_out: bool = False
    duration_ms: float = 0.0
    truncated: bool = False  # output was longer than the cap; the kept part ends with a marker
    oom_killed: bool = False
    pids_limited: bool = False  # a fork was refused by the pids limit (the command was killed)


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """Resource limits of one sandbox (a task's [environment] plus STACX's own pids limit);
    every backend enforces them (see tasks.task_limits)."""

    cpus: float = 1.0
    memory_mb: int = 2048
    pids: int = 1024
    allow_internet: bool = True
    storage_mb: int | None = None  # applied only where the storage driver supports quotas
    env: dict[str, str] = msgspec.field(default_factory=dict)


class Sandbox(Protocol):
    id: str

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        cwd: str | None = None,
    ) -> ExecResult: ...

    async def read_file(self, path: str) -> bytes: ...

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None: ...

    async def upload_dir(self, local_dir: str, remote_dir: str) -> None: ...

    async def close(self) -> None: ...

"""The exec relay: how a scaffold running *beside* the task's container (Terminus-2) acts in the
task's sandbox, one JSON request per connection on a unix socket. Each request carries the episode's
gateway credential and reaches that episode's sandbox only; errors are answers.

Design: docs/scaffolds.md#terminus-2-a-scaffold-beside-the-task
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

from stacx.errors import SandboxError
from stacx.ports import Sandbox

MAX_LINE = 64 * 1024 * 1024


class ExecRelay:
    """Credential -> the episode's task sandbox, served on a unix socket."""

    def __init__(self) -> None:
        self._sandboxes: dict[str, Sandbox] = {}

    @contextlib.contextmanager
    def register(self, credential: str, sandbox: Sandbox) -> Iterator[None]:
        """Requests carrying `credential` act in `sandbox` until exit."""
        self._sandboxes[credential] = sandbox
        try:
            yield
        finally:
            del self._sandboxes[credential]

    @contextlib.asynccontextmanager
    async def serve(self, path: str) -> AsyncIterator[str]:
        """Serve on the unix socket at `path` (world-connectable: containers run as any user)."""
        server = await asyncio.start_unix_server(self._handle, path, limit=MAX_LINE)
        os.chmod(path, 0o777)
        try:
            yield path
        finally:
            server.close()
            await server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            try:
                answer = await self.answer(json.loads(line))
            except (ValueError, TypeError, KeyError, SandboxError, OSError) as exc:
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        except (ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass  # the client went away, or sent more than MAX_LINE: nothing to answer
        finally:
            writer.close()

    async def answer(self, req: dict[str, Any]) -> dict[str, Any]:
        """One request's answer; KeyError for a missing field."""
        sandbox = self._sandboxes.get(str(req.get("credential")))
        if sandbox is None:
            return {"error": "unknown credential: no episode of this run has it"}
        op = req["op"]
        if op == "exec":
            done = await sandbox.exec(
                str(req["command"]),
                timeout=None if req.get("timeout") is None else float(req["timeout"]),
                env={str(k): str(v) for k, v in (req.get("env") or {}).items()} or None,
                user=None if req.get("user") is None else str(req["user"]),
                cwd=req.get("cwd"),
            )
            return {k: getattr(done, k) for k in ("stdout", "stderr", "exit_code", "timed_out")}
        if op == "read":
            return {"data": base64.b64encode(await sandbox.read_file(str(req["path"]))).decode()}
        if op == "write":
            data = base64.b64decode(str(req["data"]))
            await sandbox.write_file(str(req["path"]), data, int(req.get("mode", 0o644)))
            return {}
        return {"error": f"op {op!r}: accepted: exec, read, write"}

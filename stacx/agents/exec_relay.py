"""The exec relay: how a scaffold that runs *beside* the task's container (a container of its
own, e.g. Terminus-2, which drives a tmux session in the task's container as Harbor does) acts
in the task's sandbox.

One relay serves a run on a unix socket (mounted read-only into the scaffold's containers, next
to the gateway's socket). A request is one JSON line, the answer one JSON line, one request per
connection; every request carries the episode's gateway credential, and the relay answers only
for an episode that `InstalledAgent` registered (its task sandbox), so a scaffold reaches its
own episode's sandbox and nothing else:

- ``{"op": "exec", "command", "cwd", "env", "timeout", "user"}`` -> ``{"stdout", "stderr",
  "exit_code", "timed_out"}`` (`Sandbox.exec`: the command runs under ``bash -c``);
- ``{"op": "read", "path"}`` -> ``{"data": base64}``;
- ``{"op": "write", "path", "data": base64, "mode"}`` -> ``{}``.

A bad request or an unknown credential is answered ``{"error": "..."}``; an exec the sandbox
cannot reach is an error answer too (the scaffold sees it as its environment failing).
Limits: a request line up to `MAX_LINE` bytes (file writes are base64 inside it).
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
    """Credential -> the episode's task sandbox, served on a unix socket (module docstring)."""

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
        """One request's answer (see the module docstring); KeyError for a missing field."""
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
            return {
                "stdout": done.stdout,
                "stderr": done.stderr,
                "exit_code": done.exit_code,
                "timed_out": done.timed_out,
            }
        if op == "read":
            return {"data": base64.b64encode(await sandbox.read_file(str(req["path"]))).decode()}
        if op == "write":
            data = base64.b64decode(str(req["data"]))
            await sandbox.write_file(str(req["path"]), data, int(req.get("mode", 0o644)))
            return {}
        return {"error": f"op {op!r}: accepted: exec, read, write"}

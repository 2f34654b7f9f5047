"""The exec relay (how a scaffold beside the task's container acts in it): a request carrying a
registered episode's credential runs in that episode's real Docker sandbox (exec, file write and
read), and any other credential, or a bad request, is refused with an error answer."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest

from stacx.agents.exec_relay import ExecRelay
from stacx.ports import Limits
from stacx.sandbox.docker import DockerSandbox
from stacx.sandbox.images import BASE_IMAGE, bootstrap_base_image

pytestmark = pytest.mark.docker


async def ask(socket: str, **request: Any) -> dict[str, Any]:
    reader, writer = await asyncio.open_unix_connection(socket)
    writer.write(json.dumps(request).encode() + b"\n")
    await writer.drain()
    answer: dict[str, Any] = json.loads(await reader.readline())
    writer.close()
    return answer


async def test_a_registered_credential_acts_in_its_sandbox_and_no_other(tmp_path: Path) -> None:
    bootstrap_base_image()
    relay, path = ExecRelay(), str(tmp_path / "exec.sock")
    limits = Limits(allow_internet=False)
    async with (
        relay.serve(path),
        await DockerSandbox.create(BASE_IMAGE, limits, run_id="test") as mine,
        await DockerSandbox.create(BASE_IMAGE, limits, run_id="test") as other,
    ):
        with relay.register("key-a", mine), relay.register("key-b", other):
            done = await ask(
                path,
                credential="key-a",
                op="exec",
                command="hostname; echo $X >&2; exit 3",
                env={"X": "y"},
                cwd="/tmp",
                timeout=30,
            )
            assert done == {
                "stdout": mine.id[:12] + "\n",
                "stderr": "y\n",
                "exit_code": 3,
                "timed_out": False,
            }
            data = base64.b64encode(b"\x00bytes\n").decode()
            assert await ask(path, credential="key-a", op="write", path="/tmp/d/f", data=data) == {}
            got = await ask(path, credential="key-a", op="read", path="/tmp/d/f")
            assert base64.b64decode(got["data"]) == b"\x00bytes\n"
            # the other episode's sandbox has no such file: each credential reaches its own
            absent = await ask(path, credential="key-b", op="exec", command="test -e /tmp/d/f")
            assert absent["exit_code"] == 1
            timed = await ask(path, credential="key-a", op="exec", command="sleep 20", timeout=0.5)
            assert timed["timed_out"] and timed["exit_code"] is None
            bad = await ask(path, credential="key-a", op="rm")
            assert bad == {"error": "op 'rm': accepted: exec, read, write"}
            assert await ask(path, credential="key-a", op="exec") == {
                "error": "KeyError: 'command'"
            }
        # unregistered (or no longer registered) credentials are refused
        refused = await ask(path, credential="key-a", op="exec", command="true")
        assert refused == {"error": "unknown credential: no episode of this run has it"}

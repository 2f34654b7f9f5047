"""The caller's side of a process sandbox's spawner (stacx.sandbox.spawner_main): started by
vfork/exec, never by forking the caller (a process holding CUDA and a large heap would stall per
command; STYLE principle 21); it runs commands and sweeps and reports pids and exit statuses. A
spawner that dies fails its running commands with SandboxError; the next `spawn` starts another.

Design: docs/sandboxes.md#the-spawners-protocol
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import itertools
import marshal
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from stacx.errors import SandboxError

SOURCE = (Path(__file__).parent / "spawner_main.py").read_text()
START_TIMEOUT_S = 30.0

Rlimits = list[tuple[int, int, int]]  # (resource, soft, hard)


def program(
    control: str,
    root: str = "",
    sweep_uid: int | None = None,
    loopback: bool = False,
    binds: list[str] | tuple[str, ...] = (),
) -> list[str]:
    """The spawner's command line (see stacx.sandbox.spawner_main); `control` "-" probes."""
    uid = "" if sweep_uid is None else str(sweep_uid)
    args = [control, root, uid, "1" if loopback else "0", *binds]
    return [sys.executable, "-S", "-I", "-c", SOURCE, *args]


class Spawner:
    """One spawner process and its control socket. `await Spawner.start(prefix, root, uid)`."""

    def __init__(self, proc: asyncio.subprocess.Process, sock: socket.socket) -> None:
        self.proc = proc
        self.sock = sock
        self.pid = 0  # the spawner's own pid (as the host sees it), once ready
        self._ids = itertools.count(1)
        self._pids: dict[int, asyncio.Future[int]] = {}
        self._exits: dict[int, asyncio.Future[int]] = {}
        self._buf = b""
        self._lock = asyncio.Lock()
        self._failed = False

    @property
    def dead(self) -> bool:
        return self._failed or self.proc.returncode is not None

    @classmethod
    async def start(
        cls,
        prefix: list[str],
        root: str = "",
        sweep_uid: int | None = None,
        loopback: bool = False,
        binds: list[str] | tuple[str, ...] = (),
    ) -> Spawner:
        """Start one: `prefix` (`unshare ... --`) runs it; it binds, brings lo up, chroots."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv = [*prefix, *program(str(theirs.fileno()), root, sweep_uid, loopback, binds)]
        try:
            # no preexec_fn, no user/group: Python vforks (STYLE 21)
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )
        except OSError as exc:
            mine.close()
            raise SandboxError(f"cannot start a process sandbox's spawner: {exc}") from exc
        finally:
            theirs.close()
        mine.setblocking(False)
        spawner = cls(proc, mine)
        ready = spawner._pids[0] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().add_reader(mine, spawner._readable)
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                spawner.pid = await ready
        except (TimeoutError, SandboxError):
            await spawner.close()
            raise SandboxError(
                f"a process sandbox's spawner did not start (exit {proc.returncode}; "
                f"argv {' '.join(prefix)} ...; its stderr is this process's)"
            ) from None
        return spawner

    async def spawn(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        ids: tuple[int, int] | None,
        rlimits: Rlimits,
    ) -> tuple[int, asyncio.Future[int], int, int]:
        """Start a command: (pid, its exit status to come, read ends of its stdout and stderr)."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            pid, status = await self._request(
                ("exec", argv, env, cwd, ids, rlimits), [out_w, err_w]
            )
        except BaseException:
            for fd in (out_r, err_r):
                os.close(fd)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        return pid, status, out_r, err_r

    async def sweep(self, uid: int) -> bool:
        """Kill every process of `uid` (from a child of the spawner); whether none is left alive."""
        _, status = await self._request(("sweep", uid), [])
        return await status == 0

    async def close(self) -> int | None:
        """Close the socket: the spawner kills, sweeps and exits; its exit code, None if killed."""
        self._fail("the spawner was closed")
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(self.sock)
        self.sock.close()
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                return await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            return None

    async def _request(
        self, msg: tuple[Any, ...], fds: list[int]
    ) -> tuple[int, asyncio.Future[int]]:
        if self.dead:
            raise SandboxError("the process sandbox's spawner is gone")
        loop = asyncio.get_running_loop()
        rid = next(self._ids)
        pid_f = self._pids[rid] = loop.create_future()
        exit_f = self._exits[rid] = loop.create_future()
        body = marshal.dumps((msg[0], rid, *msg[1:]))
        frame = len(body).to_bytes(4, "little") + body
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        try:
            async with self._lock:  # one frame at a time; the fds ride on its first byte
                while True:
                    try:
                        sent = self.sock.sendmsg([frame], anc)
                        break
                    except BlockingIOError:
                        await self._writable()
                if sent < len(frame):
                    await loop.sock_sendall(self.sock, frame[sent:])
        except OSError as exc:
            self._fail(f"the spawner's socket failed: {exc}")
        return await pid_f, exit_f

    async def _writable(self) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()

        def writable() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_writer(self.sock, writable)
        try:
            await ready
        finally:
            loop.remove_writer(self.sock)

    def _readable(self) -> None:
        try:
            data = self.sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(self.sock)
            self._fail(f"the spawner exited (status {self.proc.returncode})")
            return
        self._buf += data
        while len(self._buf) >= 4:
            n = int.from_bytes(self._buf[:4], "little")
            if len(self._buf) < 4 + n:
                break
            kind, rid, value = marshal.loads(self._buf[4 : 4 + n])
            self._buf = self._buf[4 + n :]
            futures = self._pids if kind in ("pid", "ready") else self._exits
            future = futures.pop(rid, None)
            if future is not None and not future.done():
                future.set_result(value if kind != "exit" else os.waitstatus_to_exitcode(value))

    def _fail(self, why: str) -> None:
        self._failed = True
        for future in (*self._pids.values(), *self._exits.values()):
            if not future.done():
                future.set_exception(SandboxError(why))
                future.exception()  # marked retrieved: a command's exit nobody awaits is no error
        self._pids.clear()
        self._exits.clear()

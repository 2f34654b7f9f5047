"""The process backend of the Sandbox port: image-less tasks on machines without Docker. NOT A
SECURITY BOUNDARY: it contains an agent's accidents (fork bomb, memory bomb, runaway loop, output
flood, forbidden network); six paths are the sandbox's own, every other is the host's. The caller
never forks: a per-sandbox spawner forks each command.

Design: docs/sandboxes.md#the-process-backend
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import posixpath
import pwd
import re
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Self

from stacx.errors import SandboxError
from stacx.events import new_id
from stacx.ports import ExecResult, Limits, Sandbox
from stacx.sandbox.containment import Isolation, is_root, isolation, prepare_root, rlimits
from stacx.sandbox.output import KILL_GRACE_S, OutputCapture, OutputLimits, exec_result
from stacx.sandbox.spawner import Spawner

log = logging.getLogger(__name__)

DRAIN_GRACE_S = 2.0  # after the command exits, how long a background child may hold its pipes
SANDBOX_UID_BASE = 200_000  # root only: sandbox n runs as uid BASE + n (no passwd entry)
HOME = "/home/sandbox"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_OOM_LINE = re.compile(rb"^(MemoryError\b|.*std::bad_alloc|.*[Cc]annot allocate memory)", re.M)
_FORK_REFUSED = re.compile(
    rb"fork: (retry: )?Resource temporarily unavailable|[Cc]annot fork|can't fork"
    rb"|BlockingIOError: \[Errno 11\]"
)
_uids = itertools.count()


class _Child:
    """One running command: its process group, bounded output, and what was seen or done to it."""

    def __init__(
        self, pid: int, status: asyncio.Future[int], fds: tuple[int, int], limits: OutputLimits
    ) -> None:
        self.pid, self.status, self.fds = pid, status, fds
        self.out, self.err = OutputCapture(limits.output_limit), OutputCapture(limits.output_limit)
        self.stderr_tail = bytearray()  # the last bytes of stderr, for the flag patterns
        self.flood_limit = limits.flood_limit
        self.flooded = self.forks_refused = self.killed = False
        self._open: set[int] = set()

    @property
    def returncode(self) -> int:
        return self.status.result()

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        self.killed = self.killed or sig == signal.SIGKILL
        with contextlib.suppress(OSError):
            os.killpg(self.pid, sig)

    def read(self) -> asyncio.Future[tuple[None, None]]:
        """Both output streams, read until they close."""
        return asyncio.gather(
            self._pump(self.fds[0], self.out, bytearray()),
            self._pump(self.fds[1], self.err, self.stderr_tail),
        )

    def close(self) -> None:
        """Stop reading: the pipes still open are closed (their writers get EPIPE)."""
        loop = asyncio.get_running_loop()
        for fd in self._open:
            loop.remove_reader(fd)
            os.close(fd)
        self._open.clear()

    def _pump(self, fd: int, cap: OutputCapture, tail: bytearray) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        os.set_blocking(fd, False)
        self._open.add(fd)

        def readable() -> None:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                loop.remove_reader(fd)
                self._open.discard(fd)
                os.close(fd)
                if not done.done():
                    done.set_result(None)
                return
            self._feed(chunk, cap, tail)

        loop.add_reader(fd, readable)
        return done

    def _feed(self, chunk: bytes, cap: OutputCapture, tail: bytearray) -> None:
        cap.feed(chunk)
        tail += chunk
        del tail[:-8192]
        if cap is self.err and not self.forks_refused and _FORK_REFUSED.search(tail):
            # a fork bomb: its children would hold every pid, so it goes at once
            self.forks_refused = True
            self.kill()
        if not self.flooded and self.out.total + self.err.total > self.flood_limit:
            self.flooded = True
            self.kill()


class ProcessSandbox(OutputLimits):
    """A sandbox root with limits: `async with` or `await create(...)`; `close()` is idempotent."""

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        workdir: str = "/app",
        run_id: str = "",
        episode_id: str | None = None,
        cpu_seconds: float | None = None,
    ) -> None:
        self.limits = limits or Limits()
        self.workdir = workdir
        self.run_id = run_id
        self.episode_id = episode_id
        self.cpu_seconds = cpu_seconds  # CPU seconds per command without a timeout (None: none)
        self.id = f"stacx-proc-{new_id()[:16]}"
        self.root: Path | None = None
        self.start_ms = 0.0
        self.mapped = tuple(
            dict.fromkeys((workdir.strip("/"), "logs", "tests", "solution", "tmp", "home"))
        )
        self._probe = isolation()
        self.isolation: Isolation = self._probe.isolation
        # root: a uid of its own (docs/sandboxes.md#the-process-backend); else the caller's own user
        self.uid = (
            SANDBOX_UID_BASE + (os.getpid() * 64 + next(_uids)) % 100_000 if is_root() else None
        )
        self._binds: list[str] = []
        self._spawner: Spawner | None = None
        self._respawn = asyncio.Lock()  # one replacement of a dead spawner at a time
        self._groups: set[int] = set()
        self._closed = False
        self._warned_user = False
        self._rewrite = re.compile(
            r"(?<![\w.~/-])/(" + "|".join(re.escape(m) for m in self.mapped) + r")(?=/|$|[^\w.-])"
        )

    @classmethod
    async def create(cls, limits: Limits | None = None, **kwargs: object) -> ProcessSandbox:
        sandbox = cls(limits, **kwargs)  # type: ignore[arg-type]
        await sandbox.start()
        return sandbox

    async def start(self) -> None:
        """Make the root and its directories; start the spawner in the sandbox's namespaces."""
        t0 = time.perf_counter()
        try:
            self.root = await asyncio.to_thread(self._make_root)
            self._spawner = await self._start_spawner()
        except (OSError, SandboxError) as exc:
            await self.close()
            raise SandboxError(f"cannot make a process sandbox: {exc}") from exc
        self.start_ms = (time.perf_counter() - t0) * 1000

    async def _start_spawner(self) -> Spawner:
        """The spawner every command forks from, in the sandbox's namespaces and chroot if any."""
        root = self._root()
        net = ["--net"] if not self.limits.allow_internet and self._probe.net else []
        if self.isolation == "rewrite":
            prefix = [*self._probe.unshare, *net, "--"] if net else []
            return await Spawner.start(prefix, sweep_uid=self.uid, loopback=bool(net))
        prefix = [*self._probe.unshare, *net, "--"]
        return await Spawner.start(prefix, str(root), self.uid, bool(net), self._binds)

    def _make_root(self) -> Path:
        root = self.root = Path(tempfile.mkdtemp(prefix="stacx-sb-"))  # close() removes it
        root.chmod(0o755)
        modes = dict.fromkeys((*self.mapped, HOME[1:]), 0o755)
        modes |= {"tmp": 0o1777, "logs/verifier": 0o777, "logs/agent": 0o777}
        for name, mode in modes.items():
            (root / name).mkdir(parents=True, exist_ok=True)
            (root / name).chmod(mode)
        for name in (self.workdir.strip("/"), "solution", HOME[1:]):
            self._own(root / name)
        if self.isolation == "namespaces":
            self._binds = prepare_root(root, self.mapped)
        return root

    async def __aenter__(self) -> Self:
        if self.root is None:
            await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def host_path(self, path: str) -> Path:
        """Where `path` (absolute, or relative to the workdir) is on the host."""
        root = self._root()
        p = Path(os.path.normpath(os.path.join(self.workdir, path)))
        first = p.parts[1] if len(p.parts) > 1 else ""
        return root / p.relative_to("/") if first in self.mapped else p

    def _root(self) -> Path:
        if self.root is None or self._closed:
            raise SandboxError(f"sandbox {self.id} is not running")
        return self.root

    def _own(self, path: Path) -> None:
        """Give a path in the root to the sandbox's uid (a host path, outside it, stays as it is)."""
        if self.uid is not None and self.root is not None and path.is_relative_to(self.root):
            os.chown(path, self.uid, self.uid, follow_symlinks=False)

    def _ids(self, user: str | None) -> tuple[int, int] | None:
        """(uid, gid) a command runs as; None: the caller's own (non-root)."""
        if not is_root():
            if user not in (None, "", "0", "root") and not self._warned_user:
                self._warned_user = True
                log.warning("process sandbox %s: not root, user %r ignored", self.id, user)
            return None
        if not user:
            assert self.uid is not None
            return self.uid, self.uid
        try:
            pw = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
        except (KeyError, ValueError):
            if user.isdigit():
                return int(user), int(user)
            raise SandboxError(f"sandbox {self.id}: no user {user!r} on this host") from None
        return pw.pw_uid, pw.pw_gid

    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        """Run a command (a str under `bash -c`); SandboxError only if closed or it cannot start."""
        root = self._root()
        ids = self._ids(user)
        cwd = posixpath.normpath(posixpath.join(self.workdir, cwd or self.workdir))
        full_env, host_cwd = self._environment(root, cwd, env)
        cpu = self.cpu_seconds if timeout is None else timeout * max(self.limits.cpus, 1.0) + 1
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if self.isolation == "rewrite":
            argv = [self._rewrite.sub(lambda m: str(root) + m.group(0), a) for a in argv]
        t0 = time.perf_counter()
        spawner = await self._live_spawner()
        try:
            pid, status, *fds = await spawner.spawn(
                argv, full_env, host_cwd, ids, rlimits(self.limits, cpu)
            )
        except OSError as exc:
            raise SandboxError(f"exec in sandbox {self.id} failed: {exc}") from exc
        child = _Child(pid, status, (fds[0], fds[1]), self)
        self._groups.add(pid)
        try:
            timed_out = await self._wait(child, timeout, ids)
        finally:
            self._groups.discard(pid)
            child.close()
        return await self._outcome(child, timed_out, ids, (time.perf_counter() - t0) * 1000)

    async def _live_spawner(self) -> Spawner:
        """The spawner, a new one if it died (the dead one closed first: its sweep ends first)."""
        async with self._respawn:
            if self._spawner is None or self._spawner.dead:
                if self._spawner is not None:
                    await self._spawner.close()
                self._spawner = await self._start_spawner()
            return self._spawner

    def _environment(
        self, root: Path, cwd: str, env: dict[str, str] | None
    ) -> tuple[dict[str, str], str]:
        """The command's environment and host cwd ("rewrite" isolation: paths into the root)."""
        full_env = {
            "PATH": os.environ.get("PATH", DEFAULT_PATH),
            "HOME": HOME,
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            **self.limits.env,
            **(env or {}),
        }
        if self.isolation != "rewrite":
            return full_env, cwd  # inside the spawner's chroot
        rewritten = {
            k: self._rewrite.sub(lambda m: str(root) + m.group(0), v) for k, v in full_env.items()
        }
        return rewritten, str(self.host_path(cwd))

    async def _wait(
        self, child: _Child, timeout: float | None, ids: tuple[int, int] | None
    ) -> bool:
        """Wait for the command (TERM, KILL past `timeout`) and its output; whether it timed out."""
        readers = child.read()
        timed_out = False
        try:  # asyncio.wait: the command and its readers are never cancelled by a timeout
            if not (await asyncio.wait([child.status], timeout=timeout))[0]:
                timed_out = True
                child.kill(signal.SIGTERM)
                await asyncio.wait([child.status], timeout=KILL_GRACE_S)
                child.kill()
            await asyncio.shield(child.status)  # its exit, or the spawner's failure
            # A background child may hold the pipes open: it goes with its group (and, past
            # that, with the sandbox's uid), and its output is cut off there.
            for step in range(3):
                if (await asyncio.wait([readers], timeout=DRAIN_GRACE_S))[0]:
                    break
                child.kill()
                if step:
                    await self._sweep(ids)
            else:
                readers.cancel()
        except BaseException:
            child.kill()
            readers.cancel()
            raise
        return timed_out

    async def _outcome(
        self, child: _Child, timed_out: bool, ids: tuple[int, int] | None, duration_ms: float
    ) -> ExecResult:
        """The ExecResult of an ended command (CPU limit, OOM, forks refused, flood); sweeps."""
        rc = child.returncode
        sig = -rc if rc < 0 else (rc - 128 if 128 < rc < 160 else 0)
        err = child.err
        if sig == signal.SIGXCPU and not timed_out:
            timed_out = True
            err.feed(b"\n[stacx: the command ran out of its CPU-seconds limit (SIGXCPU)]\n")
        oom = not timed_out and (
            (sig == signal.SIGKILL and not child.killed)
            or _OOM_LINE.search(bytes(child.stderr_tail)) is not None  # a child's, too (as Docker)
        )
        pids = child.forks_refused
        if pids or oom or timed_out:
            child.kill()  # a fork bomb's children, a timed-out command's stragglers
            await self._sweep(ids)
        return exec_result(
            child.out,
            err,
            exit_code=None if timed_out else (128 + -rc if rc < 0 else rc),
            timed_out=timed_out,
            duration_ms=duration_ms,
            oom_killed=oom,
            pids_limited=pids,
            flood_limit=self.flood_limit if child.flooded else None,
        )

    async def _sweep(self, ids: tuple[int, int] | None) -> None:
        """Kill every process of the sandbox's uid (from a spawner child running as that uid)."""
        if ids is None or self.uid is None or ids[0] != self.uid or self._spawner is None:
            return
        if not await self._spawner.sweep(self.uid):
            log.warning("process sandbox %s: processes of uid %d survive a kill", self.id, self.uid)

    async def read_file(self, path: str) -> bytes:
        """A file's bytes; FileNotFoundError if it does not exist, IsADirectoryError for a dir."""
        p = self.host_path(path)
        if p.is_dir():
            raise IsADirectoryError(f"{path} (in sandbox {self.id}) is not a regular file")
        try:
            return await asyncio.to_thread(p.read_bytes)
        except FileNotFoundError:
            raise FileNotFoundError(f"{path} (in sandbox {self.id})") from None

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Write a file (parents created as needed, owned by the sandbox's uid)."""
        payload = data.encode() if isinstance(data, str) else data
        p = self.host_path(path)
        await asyncio.to_thread(self._write, p, payload, mode)

    def _write(self, p: Path, payload: bytes, mode: int) -> None:
        self._makedirs(p.parent)
        p.write_bytes(payload)
        p.chmod(mode)
        self._own(p)

    def _makedirs(self, d: Path) -> None:
        missing = []
        while not d.exists():
            missing.append(d)
            d = d.parent
        for m in reversed(missing):
            m.mkdir(mode=0o755)
            self._own(m)

    async def upload_dir(self, local_dir: str, remote_dir: str) -> None:
        """Copy a local directory's contents into `remote_dir`, modes kept (existing dirs' left)."""
        dest = self.host_path(remote_dir)
        await asyncio.to_thread(self._copy_tree, Path(local_dir), dest)

    def _copy_tree(self, src: Path, dest: Path) -> None:
        if not src.is_dir():
            raise SandboxError(f"upload: {src} is not a directory")
        self._makedirs(dest)
        for dirpath, dirnames, filenames in os.walk(src):
            rel = Path(dirpath).relative_to(src)
            for name in dirnames:
                d = dest / rel / name
                if not d.exists():
                    d.mkdir()
                    shutil.copymode(Path(dirpath) / name, d)
                    self._own(d)
            for name in filenames:
                f = dest / rel / name
                shutil.copy2(Path(dirpath) / name, f, follow_symlinks=False)
                self._own(f)

    async def close(self) -> None:
        """Kill the sandbox's processes and remove its root. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for pgid in list(self._groups):
            with contextlib.suppress(OSError):
                os.killpg(pgid, signal.SIGKILL)
        if self._spawner is not None:  # it kills its groups, sweeps the uid, and exits
            if await self._spawner.close() and self.uid is not None:
                log.warning("process sandbox %s: processes of uid %d survive", self.id, self.uid)
        if self.root is not None:
            await asyncio.to_thread(self._remove_root, self.root)

    def _remove_root(self, root: Path) -> None:
        # The host's dirs are bound into the root only inside each command's own mount
        # namespace; should one ever be mounted here, removing the root would delete host files.
        for name in self._binds:
            mountpoint = root / name
            if os.path.ismount(mountpoint) or any(mountpoint.iterdir()):
                log.error(
                    "process sandbox %s: %s is not an empty dir; root kept", self.id, mountpoint
                )
                return
            mountpoint.rmdir()
        shutil.rmtree(root, ignore_errors=True)


if TYPE_CHECKING:  # mypy checks that the backend implements the port
    _conforms: type[Sandbox] = ProcessSandbox

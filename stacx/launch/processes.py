"""``placement.mode = "processes"``: every role instance in a spawned process of its own on this
node (``python -m stacx.launch.processes``, the spec on stdin, the body ``serve_role``), while the
launcher keeps the control plane. Guarantees: no fork of a big process; a child stops when its stdin
closes (no orphan outlives a killed launcher); a child killed by a signal restarts with the same
spec (``MAX_RESTARTS``); one that exits with an error ends the run with its log's tail.
Design: docs/concepts/placement.md#processes-one-node-many-processes
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import msgspec

from stacx.actors.load import ProcessLoadWatch
from stacx.actors.run import STOP_GRACE_S, RunContext
from stacx.bus.server import free_port
from stacx.errors import StacxError
from stacx.launch.placement import HostSpec, host_specs, query_service, serve_role
from stacx.launch.plan import RoleSpec
from stacx.launch.recipe import Recipe
from stacx.store.query import QueryService

log = logging.getLogger(__name__)

MAX_RESTARTS = 3
READY = b"stacx-role-ready\n"
HURRY = b"stacx-role-hurry\n"  # before its stdin closes: the run was interrupted
START_TIMEOUT_S = 600.0  # a role builder loads models and builds sandboxes
STOP_TIMEOUT_S = 60.0
LAUNCHER_PID = "STACX_LAUNCHER_PID"  # the child's parent to watch, set before it can die
ORPHAN_GRACE_S = 20.0  # a child whose launcher died: its stop path's NATS calls time out one by one


class RoleProcessError(StacxError):
    """A role's process ended on its own with an error, or could not start."""


class RoleProcess:
    """One role instance's child process: start (spawned), ready, stop, restart."""

    def __init__(self, spec: HostSpec, log_path: Path) -> None:
        self.spec = spec
        self.log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.stopping = False

    @property
    def label(self) -> str:
        return f"{self.spec.role}-{self.spec.index}"

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log_file:  # the child keeps its own descriptor
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "stacx.launch.processes",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log_file,
                start_new_session=True,  # a Ctrl-C to the launcher's group is the launcher's
                env={**os.environ, LAUNCHER_PID: str(os.getpid())},
            )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(msgspec.json.encode(self.spec) + b"\n")
        await self.proc.stdin.drain()
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), START_TIMEOUT_S)
        except TimeoutError:
            line = b""
        if line != READY:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
            raise RoleProcessError(
                f"role {self.label} did not start (exit status {self.proc.returncode}); "
                f"the end of {self.log_path}:\n{self.tail()}"
            )
        self.log_path.with_suffix(".pid").write_text(f"{self.proc.pid}\n")
        log.info("role %s: pid %d, log %s", self.label, self.proc.pid, self.log_path)

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def died(self) -> int | None:
        """The exit status of a child that ended while it was meant to run (None: running)."""
        if self.proc is None or self.stopping:
            return None
        return self.proc.returncode

    async def stop(self, hurry: bool = False) -> None:
        """Stop the child (``hurry``: the run was interrupted; its actors get a moment)."""
        self.stopping = True
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        assert proc.stdin is not None
        if hurry:
            with contextlib.suppress(OSError):
                proc.stdin.write(HURRY)
        proc.stdin.close()  # the child's cue to stop its actors and release what it built
        try:
            await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            log.warning("role %s did not stop in %.0f s; killed", self.label, STOP_TIMEOUT_S)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


class ProcessPlacement:
    """Each role instance in a spawned process of this node."""

    mode = "processes"

    def __init__(self, run: RunContext, recipe: Recipe) -> None:
        self.run = run
        self.recipe = recipe
        self.service: QueryService | None = None
        self.children: list[RoleProcess] = []
        self.engine_url = ""
        self._watch = ProcessLoadWatch(run.emit, run.run_id, "launcher")

    async def start(self, role: RoleSpec) -> None:
        if self.service is None:
            self.service = await query_service(self.run)
            self._watch.start()
        if role.name == "engine" and not self.engine_url:
            self.engine_url = f"http://127.0.0.1:{free_port()}"  # kept across restarts
        for spec in host_specs(self.run, self.recipe, role, self.engine_url):
            child = RoleProcess(spec, self.run.run_dir / "logs" / f"{role.name}-{spec.index}.log")
            self.children.append(child)
            await child.start()

    async def check(self) -> None:
        """Raise the launcher's actors' programming error or a child's own error exit; restart a
        child killed by a signal."""
        if self.run.crashes:
            raise self.run.crashes[0]
        for child in self.children:
            status = child.died()
            if status is None:
                continue
            if status >= 0 or child.restarts >= MAX_RESTARTS:
                raise RoleProcessError(
                    f"role {child.label} (pid {child.proc.pid if child.proc else '?'}) exited "
                    f"with status {status} after {child.restarts} restarts; the end of "
                    f"{child.log_path}:\n{child.tail()}"
                )
            child.restarts += 1
            log.warning(
                "role %s was killed by signal %d; starting it again (%d/%d)",
                child.label,
                -status,
                child.restarts,
                MAX_RESTARTS,
            )
            await child.start()

    async def stop(self) -> None:
        # rollout workers and teachers first, the engine they use and the trainer last
        last = ("engine", "trainer")
        hurry = self.run.stop_grace_s < STOP_GRACE_S
        await asyncio.gather(*(c.stop(hurry) for c in self.children if c.spec.role not in last))
        await asyncio.gather(*(c.stop(hurry) for c in self.children if c.spec.role in last))
        await self._watch.stop()
        if self.service is not None:
            await self.service.stop()
        await self.run.stop_actors()


# ---- the child ------------------------------------------------------------------------------


def _end_when_orphaned(loop: asyncio.AbstractEventLoop, stop: asyncio.Event, launcher: int) -> None:
    """A daemon thread's body: once the launcher is gone (this process re-parented), ask the loop to
    stop; if the process still lives ``ORPHAN_GRACE_S`` later (its stop path waits on the NATS that
    died with the launcher, or the loop is blocked), kill its process group, itself included."""
    while os.getppid() == launcher:
        time.sleep(0.5)
    with contextlib.suppress(RuntimeError):  # the loop already closed
        loop.call_soon_threadsafe(stop.set)
    time.sleep(ORPHAN_GRACE_S)
    sys.stderr.write(
        f"the launcher is gone and this role did not stop in {ORPHAN_GRACE_S:.0f} s; killed\n"
    )
    sys.stderr.flush()
    os.killpg(os.getpgrp(), signal.SIGKILL)  # the role leads its own session (start_new_session)


async def _child_main() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    spec = msgspec.json.decode(await reader.readline(), type=HostSpec)
    control = os.fdopen(os.dup(1), "wb", buffering=0)  # the ready line; prints go to the log
    os.dup2(2, 1)
    stop, hurry = asyncio.Event(), asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    launcher = int(os.environ.get(LAUNCHER_PID, os.getppid()))  # it may be gone already
    threading.Thread(target=_end_when_orphaned, args=(loop, stop, launcher), daemon=True).start()

    async def until_eof() -> None:
        while data := await reader.read(1 << 12):
            if HURRY.strip() in data:
                hurry.set()
        stop.set()

    watcher = asyncio.create_task(until_eof())

    def ready() -> None:
        control.write(READY)

    try:
        await serve_role(spec, ready, stop, hurry)
    finally:
        watcher.cancel()


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(_child_main())


if __name__ == "__main__":
    main()

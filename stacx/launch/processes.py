"""``placement.mode = "processes"``: every role instance in a process of its own on this node.

The launcher keeps the control plane (NATS, the recorder, the scheduler, the SQL query service)
and holds no model; each role instance (the engine, each rollout worker, the trainer, a teacher)
runs ``python -m stacx.launch.processes`` with the same body as a Ray role host
(``stacx.launch.placement.serve_role``): its own NATS connection, SQL through the launcher, the
node's cross-process weight handoff (CUDA IPC or /dev/shm, ``stacx.weights.share``). Ray places
the same roles on other machines; this mode needs no Ray on one node.

Processes are spawned, never forked from a big process (posix_spawn/vfork: no ``preexec_fn``),
with the spec on stdin. A child stops when its stdin closes (the launcher stopped it, or died:
no orphan outlives a killed launcher by more than its clean stop) or on SIGTERM; its output goes
to ``<run_dir>/logs/<role>-<index>.log``, its pid to ``<role>-<index>.pid`` beside it. Each process publishes its load (``ProcessLoad``).

Supervision: a child killed by a signal (kill -9, the OOM killer) is started again, up to
``MAX_RESTARTS`` times per instance, with the same spec (the engine on the same port); its
durable consumers redeliver what it had not acknowledged, so nothing is lost or duplicated. A
child that exits with a non-zero status on its own (an error in a role builder or, in strict
mode, an actor's programming error) ends the run with its log's tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

import msgspec

from stacx.actors.load import ProcessLoadWatch
from stacx.actors.run import RunContext
from stacx.bus.server import free_port
from stacx.errors import StacxError
from stacx.launch.placement import HostSpec, serve_role
from stacx.launch.plan import RoleSpec
from stacx.launch.recipe import Recipe
from stacx.store.query import QueryService

log = logging.getLogger(__name__)

MAX_RESTARTS = 3
READY = b"stacx-role-ready\n"
START_TIMEOUT_S = 600.0  # a role builder loads models and builds sandboxes
STOP_TIMEOUT_S = 60.0


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

    async def stop(self) -> None:
        self.stopping = True
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        assert proc.stdin is not None
        proc.stdin.close()  # the child's cue to stop its actors and release what it built
        try:
            await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            log.warning("role %s did not stop in %.0f s; killed", self.label, STOP_TIMEOUT_S)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


class ProcessPlacement:
    """Each role instance in a spawned process of this node (see the module docstring)."""

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
            assert self.run.nc is not None
            self.service = QueryService(self.run.nc, self.run.run_id, self.run.query)
            await self.service.start()
            self._watch.start()
        if role.name == "engine" and not self.engine_url:
            self.engine_url = f"http://127.0.0.1:{free_port()}"  # kept across restarts
        recipe_json = msgspec.json.encode(self.recipe)
        for index in range(role.count):
            spec = HostSpec(
                recipe_json=recipe_json,
                builder=role.builder,
                index=index,
                nats_url=self.run.nats_url,
                run_id=self.run.run_id,
                run_dir=str(self.run.run_dir),
                sys_path=list(sys.path),
                role=role.name,
                engine_url=self.engine_url,
            )
            child = RoleProcess(spec, self.run.run_dir / "logs" / f"{role.name}-{index}.log")
            self.children.append(child)
            await child.start()

    async def check(self) -> None:
        """Raise an actor's programming error of the launcher, or a child's own exit with an
        error; start again a child killed by a signal."""
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
        await asyncio.gather(*(c.stop() for c in self.children if c.spec.role not in last))
        await asyncio.gather(*(c.stop() for c in self.children if c.spec.role in last))
        await self._watch.stop()
        if self.service is not None:
            await self.service.stop()
        await self.run.stop_actors()


# ---- the child ------------------------------------------------------------------------------


async def _child_main() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    spec = msgspec.json.decode(await reader.readline(), type=HostSpec)
    control = os.fdopen(os.dup(1), "wb", buffering=0)  # the ready line; prints go to the log
    os.dup2(2, 1)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    async def until_eof() -> None:
        while await reader.read(1 << 12):
            pass
        stop.set()

    watcher = asyncio.create_task(until_eof())

    def ready() -> None:
        control.write(READY)

    try:
        await serve_role(spec, ready, stop)
    finally:
        watcher.cancel()


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(_child_main())


if __name__ == "__main__":
    main()

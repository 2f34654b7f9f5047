"""RunContext: one run's bus, recorder and actors, as an async context manager. Guarantees: a rerun
on the same directory continues the same run; ``run.json`` says ``completed`` only when every actor
stopped and the recorder drained the whole log; a query sees its own context's writes; in strict
mode an actor's programming error is re-raised after the clean shutdown.
Design: docs/concepts/actors.md#the-run-context
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

import nats.aio.client
import pyarrow as pa
from nats.js import JetStreamContext

from stacx import __version__
from stacx.actors.base import (
    Actor,
    ActorContext,
    Params,
    Supervisor,
    causal_context,
    keep_running,
)
from stacx.bus.client import Publisher, connect, drain_or_close, ensure_stream, stream_replicas
from stacx.bus.server import EmbeddedNats, external_url
from stacx.errors import StacxError
from stacx.events import Event, RunFinished, RunStarted, RunStatus, stream_name
from stacx.store import db
from stacx.store.recorder import Recorder

log = logging.getLogger(__name__)
STOP_GRACE_S = 30.0  # stopping actors finish what they hold this long, then are cancelled
INTERRUPT_GRACE_S = 2.0  # the same after an interrupt: in-flight work is rerun on resume


def new_run_id(run_dir: Path) -> str:
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", run_dir.name).strip("-")[:40] or "run"
    return f"{slug}-{uuid.uuid4().hex[:8]}"


class RunContext:
    def __init__(
        self,
        run_dir: Path | str,
        *,
        recipe: str = "adhoc",
        config: dict[str, object] | None = None,
        nats_url: str | None = None,
        record: bool = True,
    ):
        self.run_dir = Path(run_dir).resolve()
        self.recipe = recipe
        self.config = config or {}
        self._nats_url = nats_url or external_url()
        self.record = record
        self.run_id = ""
        self.attempt = 0
        self.server: EmbeddedNats | None = None
        self.nc: nats.aio.client.Client | None = None
        self.js: JetStreamContext | None = None
        self.publisher: Publisher | None = None
        self.recorder: Recorder | None = None
        self._recorder_sup: asyncio.Task[None] | None = None
        self._published = 0  # newest stream sequence published through this context
        self.actors = Spawner(self.actor_context)
        # how long stopping actors get to finish what they hold (`interrupted`: a moment)
        self.stop_grace_s = STOP_GRACE_S

    @property
    def nats_url(self) -> str:
        if self._nats_url:
            return self._nats_url
        assert self.server is not None
        return self.server.url

    # ---- lifecycle -----------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        meta = db.read_run_file(self.run_dir)
        self.run_id = str(meta.get("run_id") or new_run_id(self.run_dir))
        self.attempt = int(meta.get("attempts", 0))  # type: ignore[call-overload]
        if not self._nats_url:
            self.server = EmbeddedNats(self.run_dir / "nats")
            await self.server.__aenter__()
        self.nc = await connect(self.nats_url, name=f"stacx-run-{self.run_id}")
        self.js = self.nc.jetstream(timeout=10.0)
        await ensure_stream(self.js, self.run_id, replicas=stream_replicas(self.nc))
        self.publisher = Publisher(self.js, self.run_id)
        db.update_run_file(
            self.run_dir,
            {
                "run_id": self.run_id,
                "recipe": self.recipe,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "status": "running",
                "attempts": self.attempt + 1,
                "started": meta.get("started", time.time()),
                "nats_url": self.nats_url,
            },
        )
        if self.record:
            self.recorder = Recorder(self.js, self.run_id, self.run_dir)
            await asyncio.to_thread(self.recorder.open)
            self._recorder_sup = asyncio.create_task(supervise_recorder(self.recorder))
        await self.emit(
            RunStarted(
                run_id=self.run_id,
                recipe=self.recipe,
                config_json=json.dumps(self.config, default=str),
                stacx_version=__version__,
                host=socket.gethostname(),
                attempt=self.attempt,
            )
        )
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        status = RunStatus.COMPLETED
        if et is not None:
            interrupted = et in (asyncio.CancelledError, KeyboardInterrupt)
            status = RunStatus.INTERRUPTED if interrupted else RunStatus.FAILED
            if interrupted:
                self.interrupted()
        await self.stop_actors()
        crash = self.crashes[0] if self.crashes else None
        if crash is not None and status is RunStatus.COMPLETED:
            status = RunStatus.FAILED
        problems = await self._finish(status, e or crash)
        if problems and status is RunStatus.COMPLETED:
            status = RunStatus.FAILED
        if self.recorder is not None:
            self.recorder.stop()
            if self._recorder_sup is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._recorder_sup, 10)
            await asyncio.to_thread(self.recorder.close)
        if self.publisher is not None:
            await self.publisher.close()
        if self.nc is not None:
            await drain_or_close(self.nc, drain=not self.actors.cancelled)
        if self.server is not None:
            await self.server.__aexit__(None, None, None)
        db.update_run_file(
            self.run_dir,
            {"status": str(status), "pid": None, "finished": time.time(), "problems": problems},
        )
        if crash is not None and et is None:
            raise crash

    async def _finish(self, status: RunStatus, error: BaseException | None) -> list[str]:
        """Drain the recorder, publish RunFinished and drain it; return what went wrong."""
        problems: list[str] = []
        if self.recorder is not None:
            try:
                await self.sync(30)
            except Exception as exc:
                log.exception("run %s: the recorder did not drain the stream", self.run_id)
                problems.append(f"recorder did not drain: {exc!r}")
                status = RunStatus.FAILED
        message = repr(error) if error is not None else "; ".join(problems)
        try:
            seq = await self.publish(
                RunFinished(run_id=self.run_id, status=status, message=message)
            )
        except Exception as exc:
            log.exception("run %s: RunFinished(%s) was not published", self.run_id, status)
            return [*problems, f"RunFinished not published: {exc!r}"]
        if self.recorder is not None and not problems:
            try:
                await self._committed(seq, 10)
            except Exception as exc:
                log.exception("run %s: the recorder did not record RunFinished", self.run_id)
                problems.append(f"RunFinished not recorded: {exc!r}")
        return problems

    # ---- what actors and drivers use -----------------------------------------------------

    async def emit(self, event: Event) -> None:
        await self.publish(event)

    async def publish(self, event: Event) -> int:
        """Publish, wait for the ack, return the stream sequence."""
        assert self.publisher is not None
        seq = await self.publisher.publish(event)
        self._published = max(self._published, seq)
        return seq

    async def last_seq(self) -> int:
        assert self.js is not None
        info = await self.js.stream_info(stream_name(self.run_id))
        return int(info.state.last_seq)

    async def sync(self, timeout: float | None = None) -> None:
        """Wait until the recorder has committed every event in the stream so far."""
        await self._committed(await self.last_seq(), timeout)

    async def _committed(self, seq: int, timeout: float | None = None) -> None:
        """Wait until the recorder has committed `seq`; raise if the recorder died meanwhile."""
        assert self.recorder is not None, "this run does not record"
        if self.recorder.position >= seq:
            return
        waiter = asyncio.ensure_future(self.recorder.wait_for(seq, timeout))
        watch = {waiter} if self._recorder_sup is None else {waiter, self._recorder_sup}
        done, _ = await asyncio.wait(watch, return_when=asyncio.FIRST_COMPLETED)
        if waiter in done:
            waiter.result()
            return
        waiter.cancel()
        assert self._recorder_sup is not None
        self._recorder_sup.result()  # the recorder's crash (strict mode), if that ended it
        raise StacxError(f"the recorder stopped before committing stream sequence {seq}")

    async def query(
        self, sql: str, params: Params = None, /, *, after: int | None = None, barrier: bool = False
    ) -> pa.Table:
        """SQL over the log with bound ``params`` once the recorder has committed ``after``
        (default: this context's newest publish); ``barrier``: everything published so far."""
        seq = await self.last_seq() if barrier else self._published if after is None else after
        await self._committed(seq)
        assert self.recorder is not None
        return await self.recorder.query(sql, params)

    def actor_context(self) -> ActorContext:
        """A fresh context for one actor: its queries wait for what it published or was delivered,
        and for what this context published before it was spawned."""
        assert self.js is not None and self.nc is not None
        return causal_context(
            run_id=self.run_id,
            run_dir=str(self.run_dir),
            js=self.js,
            nc=self.nc,
            publish=self.publish,
            query=self.query,
            head=self.last_seq,
            start=self._published,
        )

    @property
    def crashes(self) -> list[BaseException]:
        """Strict mode: the programming errors that ended spawned actors, in order."""
        return self.actors.crashes

    def spawn(self, actor: Actor, *, instance: int | None = None) -> Supervisor:
        """Start an actor here, as a supervised asyncio task (see ``Spawner.spawn``)."""
        return self.actors.spawn(actor, instance=instance)

    def interrupted(self) -> None:
        """The run was interrupted (Ctrl-C, SIGTERM): actors and role hosts stopped from now on
        are cancelled after `INTERRUPT_GRACE_S`, not the graceful stop's `STOP_GRACE_S` (their
        in-flight episodes are rerun on resume)."""
        self.stop_grace_s = INTERRUPT_GRACE_S

    async def stop_actors(self) -> None:
        await self.actors.stop(self.stop_grace_s)


class Spawner:
    """Actors as supervised asyncio tasks of this process, the one spawn routine of every placement:
    a fresh context each, instance numbers in spawn order (or the caller's ``instance``; shared: 0);
    ``crashes`` collects strict-mode programming errors, which ``stop`` never raises;
    ``cancelled``: a ``stop`` cancelled actors still running at its timeout."""

    def __init__(self, context: Callable[[], ActorContext]) -> None:
        self.context = context
        self.crashes: list[BaseException] = []
        self.cancelled = False
        self._tasks: list[asyncio.Task[None]] = []
        self._supervisors: list[Supervisor] = []
        self._instances: dict[str, int] = {}  # actor name -> next automatic instance number

    def spawn(self, actor: Actor, *, instance: int | None = None) -> Supervisor:
        if actor.shared:
            instance = 0
        else:
            instance = self._instances.get(actor.name, 0) if instance is None else instance
            self._instances[actor.name] = max(self._instances.get(actor.name, 0), instance + 1)
        actor.bind(self.context(), instance=instance)
        sup = Supervisor(actor)
        self._supervisors.append(sup)
        task = asyncio.create_task(sup.run(), name=f"actor:{actor.name}")
        task.add_done_callback(self._note_crash)
        self._tasks.append(task)
        return sup

    def _note_crash(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.crashes.append(task.exception())  # type: ignore[arg-type]

    async def stop(self, timeout: float = STOP_GRACE_S) -> None:
        """Ask every actor to stop, cancel those still running after ``timeout`` seconds."""
        for s in self._supervisors:
            s.stop.set()
        if self._tasks:
            _done, pending = await asyncio.wait(self._tasks, timeout=timeout)
            for t in pending:
                t.cancel()
            self.cancelled = self.cancelled or bool(pending)
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self._supervisors.clear()


async def supervise_recorder(recorder: Recorder) -> None:
    """Run the recorder, again after a crash (each run resumes from the committed position)."""
    await keep_running("recorder", recorder.run)

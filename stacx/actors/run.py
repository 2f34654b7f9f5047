"""RunContext: one run's bus, recorder and actors, as an async context manager.

    async with RunContext(run_dir, recipe="grpo", config=cfg) as run:
        await run.emit(TaskScheduled(run_id=run.run_id, ...))
        run.spawn(SomeActor())
        table = await run.query("select * from episodes")

On enter: the run directory is created or reopened (a rerun on the same directory continues the
same run id, stream and log), NATS is started (embedded, unless ``STACX_NATS_URL`` is set), the
run's stream is ensured, the recorder starts, and ``RunStarted`` is published. On exit: actors
stop, ``RunFinished`` is published (status ``completed``, ``failed`` on an exception,
``interrupted`` on cancellation/Ctrl-C), the recorder drains everything published, and the
server stops. ``query`` first waits until the recorder has committed every event published so
far by anyone, so a reader sees its own writes.
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
from pathlib import Path
from types import TracebackType
from typing import Self

import nats.aio.client
import pyarrow as pa
from nats.js import JetStreamContext

from stacx import __version__
from stacx.actors.base import Actor, ActorContext, Supervisor
from stacx.bus.client import Publisher, connect, ensure_stream
from stacx.bus.server import EmbeddedNats, external_url
from stacx.events import Event, RunFinished, RunStarted, stream_name
from stacx.store import db
from stacx.store.recorder import Recorder

log = logging.getLogger(__name__)


def new_run_id(run_dir: Path) -> str:
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", run_dir.name).strip("-")[:40] or "run"
    return f"{slug}-{uuid.uuid4().hex[:8]}"


class RunContext:
    def __init__(self, run_dir: Path | str, *, recipe: str = "adhoc",
                 config: dict[str, object] | None = None, nats_url: str | None = None,
                 record: bool = True):
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
        self._tasks: list[asyncio.Task[None]] = []
        self._supervisors: list[Supervisor] = []
        self._recorder_sup: asyncio.Task[None] | None = None

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
        await ensure_stream(self.js, self.run_id)
        self.publisher = Publisher(self.js, self.run_id)
        db.write_run_file(self.run_dir, {
            **meta, "run_id": self.run_id, "recipe": self.recipe, "pid": os.getpid(),
            "host": socket.gethostname(), "status": "running", "attempts": self.attempt + 1,
            "started": meta.get("started", time.time()), "nats_url": self.nats_url,
        })
        if self.record:
            self.recorder = Recorder(self.js, self.run_id, self.run_dir)
            await asyncio.to_thread(self.recorder.open)
            self._recorder_sup = asyncio.create_task(self._supervise_recorder())
        await self.emit(RunStarted(
            run_id=self.run_id, recipe=self.recipe, config_json=json.dumps(self.config, default=str),
            stacx_version=__version__, host=socket.gethostname(), attempt=self.attempt,
        ))
        return self

    async def _supervise_recorder(self) -> None:
        backoff = 0.1
        while True:
            assert self.recorder is not None
            try:
                await self.recorder.run()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("recorder crashed; restarting in %.1fs", backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        status = "completed" if et is None else (
            "interrupted" if et in (asyncio.CancelledError, KeyboardInterrupt) else "failed")
        await self.stop_actors()
        with contextlib.suppress(Exception):
            await self.emit(RunFinished(run_id=self.run_id, status=status, message=repr(e) if e else ""))
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.sync(), 30)
        if self.recorder is not None:
            self.recorder.stop()
            if self._recorder_sup is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._recorder_sup, 10)
            await asyncio.to_thread(self.recorder.close)
        if self.publisher is not None:
            await self.publisher.close()
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.drain()
        if self.server is not None:
            await self.server.__aexit__(None, None, None)
        meta = db.read_run_file(self.run_dir)
        db.write_run_file(self.run_dir, {**meta, "status": status, "pid": None, "finished": time.time()})

    # ---- what actors and drivers use -----------------------------------------------------

    async def emit(self, event: Event) -> None:
        assert self.publisher is not None
        await self.publisher.publish(event)

    async def publish(self, event: Event) -> int:
        assert self.publisher is not None
        return await self.publisher.publish(event)

    async def last_seq(self) -> int:
        assert self.js is not None
        info = await self.js.stream_info(stream_name(self.run_id))
        return int(info.state.last_seq)

    async def sync(self, timeout: float | None = None) -> None:
        """Wait until the recorder has committed every event in the stream so far."""
        assert self.recorder is not None, "this run does not record"
        await self.recorder.wait_for(await self.last_seq(), timeout)

    async def query(self, sql: str) -> pa.Table:
        await self.sync()
        assert self.recorder is not None
        return await self.recorder.query(sql)

    def actor_context(self) -> ActorContext:
        assert self.js is not None
        return ActorContext(run_id=self.run_id, run_dir=str(self.run_dir), publish=self.publish,
                            query=self.query, js=self.js)

    def spawn(self, actor: Actor) -> Supervisor:
        """Start an actor here, as a supervised asyncio task (local placement)."""
        actor.bind(self.actor_context())
        sup = Supervisor(actor)
        self._supervisors.append(sup)
        self._tasks.append(asyncio.create_task(sup.run(), name=f"actor:{actor.name}"))
        return sup

    async def stop_actors(self, timeout: float = 30.0) -> None:
        for s in self._supervisors:
            s.stop.set()
        if self._tasks:
            _done, pending = await asyncio.wait(self._tasks, timeout=timeout)
            for t in pending:
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self._supervisors.clear()

"""The actor runtime: a thin shell that turns events into calls of ``handle``.

An actor subscribes to some kinds of its run's events through a durable JetStream consumer
named after it, so a restarted actor resumes where it stopped. Each event is acknowledged only
after ``handle`` returns, i.e. after its effect (published events, a checkpoint on disk) is
durable; an exception makes the event come back later (``nak`` with a delay), up to
``max_deliver`` times, after which it is terminated and an ``InfraFailed`` is published.

``shared = True`` makes all instances of an actor with the same name share one consumer: a
work queue (e.g. rollout workers on ``TaskScheduled``). Long handlers keep their message alive
with ``in_progress`` heartbeats, so ``ack_wait`` bounds only a silent, hung worker.

Actors never share memory with each other: they meet through events (and the trace store's
SQL, through ``ActorContext.query``), so local (asyncio) and Ray placement run the same code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import ClassVar

import msgspec
import pyarrow as pa
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import BadRequestError

from stacx.events import Event, FailureKind, InfraFailed, decode, stream_name, subject

log = logging.getLogger(__name__)

Query = Callable[[str], Awaitable[pa.Table]]


class ActorContext(msgspec.Struct, frozen=True, kw_only=True):
    """What an actor may touch: its run's id, a publish function, the log's SQL, JetStream."""

    run_id: str
    run_dir: str
    publish: Callable[[Event], Awaitable[int]]
    query: Query
    js: JetStreamContext


class Actor:
    """Base class. Subclasses set ``name`` and ``kinds`` and implement ``handle``."""

    name: ClassVar[str] = "actor"
    kinds: ClassVar[tuple[type[Event], ...]] = ()
    shared: ClassVar[bool] = False
    max_inflight: ClassVar[int] = 1
    max_deliver: ClassVar[int] = 5
    ack_wait: ClassVar[float] = 60.0
    retry_delay: ClassVar[float] = 1.0

    ctx: ActorContext

    def bind(self, ctx: ActorContext) -> None:
        self.ctx = ctx

    @property
    def run_id(self) -> str:
        return self.ctx.run_id

    async def publish(self, event: Event) -> int:
        return await self.ctx.publish(event)

    async def query(self, sql: str) -> pa.Table:
        return await self.ctx.query(sql)

    async def on_start(self) -> None:
        """Called before the first event (and again after a restart)."""

    async def on_stop(self) -> None:
        """Called at shutdown."""

    async def handle(self, event: Event) -> None:
        raise NotImplementedError

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until `stop` is set. Raises only on infrastructure failure."""
        if not self.kinds:
            await stop.wait()
            return
        js = self.ctx.js
        subjects = [subject(self.run_id, k.__name__) for k in self.kinds]
        cfg = ConsumerConfig(
            durable_name=self.name,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=self.ack_wait,
            max_deliver=self.max_deliver,
            max_ack_pending=max(1024, self.max_inflight * 4),
        )
        if len(subjects) == 1:
            cfg.filter_subject = subjects[0]
        else:
            cfg.filter_subjects = subjects
        stream = stream_name(self.run_id)
        with contextlib.suppress(BadRequestError):  # exists already (a restart): keep its position
            await js.add_consumer(stream, cfg)
        sub = await js.pull_subscribe_bind(self.name, stream=stream)
        slots = asyncio.Semaphore(self.max_inflight)
        inflight: set[asyncio.Task[None]] = set()
        try:
            while not stop.is_set():
                free = max(1, self.max_inflight - len(inflight))
                try:
                    msgs = await sub.fetch(free, timeout=0.25)
                except (TimeoutError, NatsTimeout):
                    continue
                for m in msgs:
                    await slots.acquire()
                    t = asyncio.create_task(self._dispatch(m))
                    inflight.add(t)
                    t.add_done_callback(inflight.discard)
                    t.add_done_callback(lambda _t: slots.release())
        finally:
            if inflight:
                await asyncio.gather(*inflight, return_exceptions=True)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _dispatch(self, msg: Msg) -> None:
        try:
            event = decode(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            await msg.ack()  # the recorder dead-letters it; an actor skips what it cannot read
            return
        beat = asyncio.create_task(_heartbeat(msg, self.ack_wait / 3))
        try:
            await self.handle(event)
        except asyncio.CancelledError:
            beat.cancel()
            raise
        except Exception as exc:
            beat.cancel()
            delivered = msg.metadata.num_delivered
            log.exception("%s: handling %s failed (delivery %d)", self.name, event.kind, delivered)
            if delivered >= self.max_deliver:
                await msg.term()
                await self.publish(InfraFailed(
                    run_id=self.run_id, failure_kind=FailureKind.INTERNAL,
                    message=f"actor {self.name} gave up on {event.kind} {event.event_id}: {exc!r}",
                    episode_id=getattr(event, "episode_id", None), attempt=delivered,
                ))
            else:
                await msg.nak(delay=self.retry_delay * delivered)
            return
        beat.cancel()
        await msg.ack()


async def _heartbeat(msg: Msg, every: float) -> None:
    with contextlib.suppress(Exception):
        while True:
            await asyncio.sleep(every)
            await msg.in_progress()


class Supervisor:
    """Keeps one actor running: restarts it after a crash with capped exponential backoff."""

    def __init__(self, actor: Actor, *, max_backoff: float = 10.0):
        self.actor = actor
        self.max_backoff = max_backoff
        self.restarts = 0
        self.stop = asyncio.Event()

    async def run(self) -> None:
        backoff = 0.1
        while not self.stop.is_set():
            try:
                await self.actor.on_start()
                await self.actor.run(self.stop)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                self.restarts += 1
                log.exception("actor %s crashed; restart %d in %.1fs", self.actor.name, self.restarts, backoff)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), backoff)
                backoff = min(backoff * 2, self.max_backoff)
            finally:
                with contextlib.suppress(Exception):
                    await self.actor.on_stop()

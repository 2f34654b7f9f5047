"""The actor runtime: a thin shell that turns events of durable JetStream consumers into calls of
``handle``. Guarantees: an event is acked only after ``handle`` returns; a failing one comes back,
up to ``max_deliver`` times, then an ``InfraFailed`` is published; a query sees at least what its
actor published or was woken by; under ``STACX_STRICT=1`` a programming error is re-raised.
Design: docs/concepts/actors.md
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import ClassVar

import msgspec
import nats.errors
import pyarrow as pa
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import BadRequestError

from stacx.errors import StacxError, strict  # strict: re-exported, the mode is the runtime's
from stacx.events import (
    Event,
    FailureKind,
    InfraFailed,
    stream_name,
    subject,
)
from stacx.store.query import Params, Query, QueryAfter  # re-exported: actors query the log
from stacx.wire import decode, decode_many, split_batch

log = logging.getLogger(__name__)


class Watermark:
    """The newest stream sequence one reader has published or been delivered: what the log must
    contain before that reader's next query."""

    def __init__(self, seq: int = 0) -> None:
        self.seq = seq

    def advance(self, seq: int) -> None:
        self.seq = max(self.seq, seq)


class ActorContext(msgspec.Struct, frozen=True, kw_only=True):
    """What an actor may touch: its run's id, publish, the log's SQL, JetStream and ``nc``; one per
    actor instance, its ``publish`` and ``query`` bound to ``watermark``."""

    run_id: str
    run_dir: str
    publish: Callable[[Event], Awaitable[int]]  # waits for the ack; returns the stream sequence
    query: Query
    head: Callable[[], Awaitable[int]]  # the stream's last sequence now (for a barrier)
    js: JetStreamContext
    nc: NATS
    watermark: Watermark


def causal_context(
    *,
    run_id: str,
    run_dir: str,
    js: JetStreamContext,
    nc: NATS,
    publish: Callable[[Event], Awaitable[int]],
    query: QueryAfter,
    head: Callable[[], Awaitable[int]],
    start: int = 0,
) -> ActorContext:
    """A context whose queries wait for its own publishes and deliveries, and for ``start``."""
    mark = Watermark(start)

    async def publish_tracked(event: Event) -> int:
        seq = await publish(event)
        mark.advance(seq)
        return seq

    async def query_after(sql: str, params: Params = None, /) -> pa.Table:
        return await query(sql, params, after=mark.seq)

    return ActorContext(
        run_id=run_id,
        run_dir=run_dir,
        publish=publish_tracked,
        query=query_after,
        head=head,
        js=js,
        nc=nc,
        watermark=mark,
    )


INFRA_ERRORS: tuple[type[BaseException], ...] = (StacxError, OSError, nats.errors.Error)
"""Exception types that are infrastructure (retried, restarted). OSError covers TimeoutError
(asyncio's included) and connection errors."""


CONTROL_FLOW: tuple[type[BaseException], ...] = (
    asyncio.CancelledError,
    KeyboardInterrupt,
    SystemExit,
    GeneratorExit,
)
"""What unwinds a task or the process: passed on, never handled as a failure."""


def is_bug(exc: BaseException) -> bool:
    """A programming error: anything not in ``INFRA_ERRORS`` nor ``CONTROL_FLOW``, including a
    ``BaseException`` that is no ``Exception`` (it must reach the run, never vanish with a task)."""
    return not isinstance(exc, INFRA_ERRORS + CONTROL_FLOW)


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
    instance: int = 0  # this instance's number among same-named instances (set by ``bind``)
    _bugs: list[BaseException]  # strict mode: programming errors of handlers, raised by ``run``

    def bind(self, ctx: ActorContext, *, instance: int = 0) -> None:
        self.ctx = ctx
        self.instance = instance

    @property
    def consumer(self) -> str:
        """The durable consumer's name: shared by same-named instances iff ``shared``."""
        return self.name if self.shared or self.instance == 0 else f"{self.name}-{self.instance}"

    @property
    def run_id(self) -> str:
        return self.ctx.run_id

    async def publish(self, event: Event) -> int:
        return await self.ctx.publish(event)

    async def query(self, sql: str, params: Params = None, *, barrier: bool = False) -> pa.Table:
        """SQL over the log once it holds everything this actor published or was delivered;
        ``barrier``: and everything anyone published before this call."""
        if barrier:
            self.ctx.watermark.advance(await self.ctx.head())
        return await self.ctx.query(sql, params)

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
            durable_name=self.consumer,
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
        sub = await js.pull_subscribe_bind(self.consumer, stream=stream)
        slots = asyncio.Semaphore(self.max_inflight)
        inflight: set[asyncio.Task[None]] = set()
        self._bugs: list[BaseException] = []
        try:
            while not stop.is_set():
                if self._bugs:
                    raise self._bugs[0]  # strict mode: a handler's programming error ends the actor
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
        """Handle the events of one message in order and ack once all are handled; a failure naks
        the whole message (handlers are idempotent)."""
        events = _readable(msg.data)  # the recorder dead-letters what is unreadable; actors skip it
        if not events:
            await msg.ack()
            return
        if self._bugs:  # strict mode: this actor is ending on a bug; handle nothing more
            await msg.nak()
            return
        self.ctx.watermark.advance(int(msg.metadata.sequence.stream))  # its query must see it
        beat = asyncio.create_task(_heartbeat(msg, self.ack_wait / 3))
        gave_up = False
        try:
            for event in events:
                try:
                    await self.handle(event)
                except CONTROL_FLOW:
                    raise
                except BaseException as exc:  # an Exception, or what a library raises as less
                    delivered = msg.metadata.num_delivered
                    log.exception(
                        "%s: handling %s failed (delivery %d)", self.name, event.kind, delivered
                    )
                    if strict() and is_bug(exc):
                        await msg.nak()  # left in the stream for the next (fixed) run to handle
                        self._bugs.append(exc)
                        return
                    if delivered < self.max_deliver:
                        await msg.nak(delay=self.retry_delay * delivered)
                        return
                    gave_up = True  # this event is given up; the rest of its message go on
                    await self.publish(
                        InfraFailed(
                            run_id=self.run_id,
                            failure_kind=FailureKind.INTERNAL,
                            message=f"actor {self.name} gave up on {event.kind} {event.event_id}: {exc!r}",
                            episode_id=getattr(event, "episode_id", None),
                            attempt=delivered,
                        )
                    )
        finally:
            beat.cancel()
        await (msg.term() if gave_up else msg.ack())


def _readable(payload: bytes) -> list[Event]:
    try:
        return list(decode_many(payload))
    except (msgspec.DecodeError, msgspec.ValidationError):
        pass
    out: list[Event] = []
    with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
        for part in split_batch(payload):
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                out.append(decode(part))
    return out


async def _heartbeat(msg: Msg, every: float) -> None:
    with contextlib.suppress(Exception):
        while True:
            await asyncio.sleep(every)
            await msg.in_progress()


async def keep_running(
    name: str,
    body: Callable[[], Awaitable[None]],
    *,
    stop: asyncio.Event | None = None,
    max_backoff: float = 10.0,
    on_crash: Callable[[], None] | None = None,
) -> None:
    """Await ``body()`` until it returns or ``stop`` is set, rerunning it after a crash with capped
    exponential backoff; under STACX_STRICT a programming error is raised instead."""
    backoff, restarts = 0.1, 0
    stop = stop or asyncio.Event()
    while not stop.is_set():
        try:
            await body()
            return
        except CONTROL_FLOW:
            raise
        except BaseException as exc:
            if strict() and is_bug(exc):
                log.critical(
                    "%s: programming error; STACX_STRICT is set, so it is not restarted",
                    name,
                    exc_info=exc,
                )
                raise
            restarts += 1
            if on_crash is not None:
                on_crash()
            log.exception("%s crashed; restart %d in %.1fs", name, restarts, backoff)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff)
            backoff = min(backoff * 2, max_backoff)


class Supervisor:
    """Keeps one actor running: restarts it after a crash with capped exponential backoff."""

    def __init__(self, actor: Actor, *, max_backoff: float = 10.0):
        self.actor = actor
        self.max_backoff = max_backoff
        self.restarts = 0
        self.stop = asyncio.Event()

    async def run(self) -> None:
        await keep_running(
            f"actor {self.actor.name}",
            self._once,
            stop=self.stop,
            max_backoff=self.max_backoff,
            on_crash=self._crashed,
        )

    def _crashed(self) -> None:
        self.restarts += 1

    async def _once(self) -> None:
        try:
            await self.actor.on_start()
            await self.actor.run(self.stop)
        finally:
            with contextlib.suppress(Exception):
                await self.actor.on_stop()

"""The run's JetStream stream (``STACX_<run_id>``, a day's duplicate window) and the publisher,
which batches, pipelines up to ``max_pending`` publishes (the backpressure) and checks every ack:
a publish not acknowledged raises ``PublishError``, nothing is dropped silently.
Design: docs/concepts/events.md#the-publisher
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from dataclasses import dataclass, field

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import PubAck, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from stacx.bus.connection import connect
from stacx.errors import PublishError, StacxError
from stacx.events import Event, stream_name, subject
from stacx.wire import encode, encode_batch

DUPLICATE_WINDOW_S = 24 * 3600.0
__all__ = ["Publisher", "connect", "ensure_stream", "stream_replicas"]


ENV_REPLICAS = "STACX_NATS_REPLICAS"


DRAIN_S = 5.0  # a connection drains this long at most, then closes


async def drain_or_close(nc: NATS, drain: bool = True) -> None:
    """Drain `nc` (its subscriptions' pending messages handled, its publishes flushed) for at most
    `DRAIN_S`, then close it: a subscriber whose task was cancelled mid-message never finishes its
    drain, which nats-py would wait on for its own 30 s timeout. ``drain=False``: close at once
    (actors were cancelled mid-message, so the drain would only wait out `DRAIN_S`; what they
    had not acknowledged is delivered again on resume)."""
    if drain:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.drain(), DRAIN_S)
    with contextlib.suppress(Exception):
        await nc.close()


def stream_replicas(nc: NATS) -> int:
    """Copies of a new run stream: $STACX_NATS_REPLICAS, else 3 when the client knows of 3 or
    more servers (given or announced), else 1."""
    known = len({(u.hostname, u.port) for u in nc.servers})
    raw = os.environ.get(ENV_REPLICAS)
    if raw is None:
        return 3 if known >= 3 else 1
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= 5:
        raise StacxError(f"{ENV_REPLICAS}={raw!r}: accepted values are 1 to 5 (JetStream replicas)")
    if n > known:
        raise StacxError(
            f"{ENV_REPLICAS}={n}: the NATS deployment shows only {known} server(s); "
            f"a stream cannot have more replicas than servers"
        )
    return n


async def ensure_stream(js: JetStreamContext, run_id: str, *, replicas: int = 1) -> str:
    """Create the run's stream if missing, with `replicas` copies (else use it as is); its name."""
    name = stream_name(run_id)
    try:
        await js.stream_info(name)
    except NotFoundError:
        await js.add_stream(
            StreamConfig(
                name=name,
                subjects=[f"stacx.{run_id}.>"],
                storage=StorageType.FILE,
                retention=RetentionPolicy.LIMITS,
                duplicate_window=DUPLICATE_WINDOW_S,
                num_replicas=replicas,
            )
        )
    return name


@dataclass(eq=False)
class _Batch:
    """Events of one kind waiting to go out as one message, and the future of its ack."""

    kind: str
    future: asyncio.Future[PubAck]
    events: list[Event] = field(default_factory=list)
    payloads: list[bytes] = field(default_factory=list)
    size: int = 0
    payload: bytes = b""  # the message, built once: every retry sends the same bytes and id
    msg_id: str = ""
    first_try: float = 0.0
    attempts: int = 0
    submitted: bool = False  # holds fire-and-forget events: a failure is also raised by flush()


class Publisher:
    """Publishes events of one run with message-id de-duplication, batching (one message per
    kind per event-loop tick) and bounded pipelining. Events of one kind keep their order; a
    failed or unanswered try is re-sent, same message id, until ``ack_timeout`` (PublishError)."""

    def __init__(
        self,
        js: JetStreamContext,
        run_id: str,
        *,
        max_pending: int = 4096,
        ack_timeout: float = 30.0,
        batch_events: int = 256,
        batch_bytes: int = 256 * 1024,
    ):
        self.js = js
        self.run_id = run_id
        self.ack_timeout = ack_timeout
        self.batch_events = max(1, batch_events)
        self.batch_bytes = batch_bytes  # well under the server's max_payload (1 MiB by default)
        self._window = asyncio.Semaphore(max_pending)  # events in flight
        self._pending: set[asyncio.Future[PubAck]] = set()  # batches sent, not yet answered
        self._retrying: set[asyncio.Task[None]] = set()
        self._errors: list[PublishError] = []
        self._open: dict[str, _Batch] = {}
        self._sender: asyncio.Task[None] | None = None
        self.published = 0
        self.duplicates = 0
        self.messages = 0
        self.retries = 0
        self.attempt_timeout = min(2.0, ack_timeout)

    async def publish(self, event: Event) -> int:
        """Publish and wait for the ack; return the stream sequence of its message."""
        fut = await self._add(event, awaited=True)
        try:
            ack = await asyncio.wait_for(
                asyncio.shield(fut), self.ack_timeout + self.attempt_timeout
            )
        except Exception as exc:  # any transport/timeout/JetStream error: the caller must see it
            raise PublishError(
                f"publish of {event.kind} {event.event_id} to "
                f"{subject(self.run_id, event.kind)} not acknowledged: {exc!r}"
            ) from exc
        return int(ack.seq)

    async def submit(self, event: Event) -> asyncio.Future[PubAck]:
        """Publish without waiting for the ack (only while the window is full); a failed ack is
        raised by the next ``flush`` or ``submit``. Returns the future of the message's ack."""
        if self._errors:
            raise PublishError(f"earlier publish failed: {self._errors[0]}") from self._errors[0]
        return await self._add(event, awaited=False)

    async def _add(self, event: Event, *, awaited: bool) -> asyncio.Future[PubAck]:
        await self._window.acquire()
        payload = encode(event)
        batch = self._open.get(event.kind)
        if batch is not None and batch.size + len(payload) > self.batch_bytes:
            del self._open[event.kind]  # this one would make the message too big: send it first
            await self._send(batch)
            batch = None
        if batch is None:
            batch = self._open[event.kind] = _Batch(
                event.kind, asyncio.get_running_loop().create_future()
            )
        batch.events.append(event)
        batch.payloads.append(payload)
        batch.size += len(payload)
        batch.submitted |= not awaited
        if len(batch.events) >= self.batch_events:
            del self._open[event.kind]
            await self._send(batch)
        elif self._sender is None:
            self._sender = asyncio.create_task(self._send_open())  # runs once this tick yields
        return batch.future

    async def _send_open(self) -> None:
        self._sender = None
        batches = list(self._open.values())
        self._open.clear()
        for b in batches:
            await self._send(b)

    async def _send(self, b: _Batch) -> None:
        if len(b.events) == 1:
            b.payload, b.msg_id = b.payloads[0], b.events[0].event_id
        else:
            b.payload = encode_batch(b.payloads)
            digest = hashlib.blake2b(
                "\n".join(e.event_id for e in b.events).encode(), digest_size=16
            )
            b.msg_id = f"batch-{digest.hexdigest()}"
        b.first_try = time.monotonic()
        self._pending.add(b.future)
        b.future.add_done_callback(self._pending.discard)
        await self._attempt(b)

    async def _attempt(self, b: _Batch) -> None:
        """One try; a failed or unanswered try is retried with the same message id (so the
        server de-duplicates it) until ``ack_timeout`` has passed since the first."""
        b.attempts += 1
        try:
            fut = await self.js.publish_async(
                subject(self.run_id, b.kind), b.payload, headers={"Nats-Msg-Id": b.msg_id}
            )
        except asyncio.CancelledError:
            self._failed(b, PublishError(f"publish of {len(b.events)} {b.kind} cancelled"))
            raise
        except Exception as exc:
            self._retry_or_fail(b, exc)
            return
        self.messages += 1
        timer = asyncio.get_running_loop().call_later(self.attempt_timeout, fut.cancel)
        fut.add_done_callback(lambda f: self._done(f, b, timer))

    def _retry_or_fail(self, b: _Batch, exc: BaseException) -> None:
        waited = time.monotonic() - b.first_try
        if waited + self.retry_wait(b.attempts) >= self.ack_timeout:
            self._failed(
                b,
                PublishError(
                    f"publish of {len(b.events)} {b.kind} not acknowledged after {b.attempts} "
                    f"tries in {waited:.1f}s: {exc!r}"
                ),
            )
            return
        self.retries += 1
        task = asyncio.get_running_loop().create_task(self._again(b))
        self._retrying.add(task)
        task.add_done_callback(self._retrying.discard)

    @staticmethod
    def retry_wait(attempts: int) -> float:
        return min(0.05 * 2**attempts, 1.0)

    async def _again(self, b: _Batch) -> None:
        await asyncio.sleep(self.retry_wait(b.attempts))
        await self._attempt(b)

    def _failed(self, b: _Batch, err: PublishError) -> None:
        for _ in b.events:
            self._window.release()
        if not b.future.done():
            b.future.set_exception(err)
            b.future.exception()  # retrieved: an unawaited batch's error is reported by flush
        if b.submitted:
            self._errors.append(err)

    def _done(self, fut: asyncio.Future[PubAck], b: _Batch, timer: asyncio.TimerHandle) -> None:
        timer.cancel()
        if fut.cancelled():  # no answer within attempt_timeout (a server lost, a new leader)
            self._retry_or_fail(b, TimeoutError(f"no ack within {self.attempt_timeout}s"))
            return
        exc = fut.exception()
        if exc is not None:  # e.g. no responders while the stream has no leader
            self._retry_or_fail(b, exc)
            return
        for _ in b.events:
            self._window.release()
        ack = fut.result()
        self.published += len(b.events)
        if ack.duplicate:
            self.duplicates += len(b.events)
        if not b.future.done():
            b.future.set_result(ack)

    async def flush(self) -> None:
        """Wait for every submitted publish (retries included); raise the first failure."""
        if self._sender is not None:
            await self._sender
        if self._open:
            await self._send_open()
        while self._pending:
            await asyncio.wait(list(self._pending))
        if self._errors:
            err, self._errors = self._errors[0], []
            raise err

    async def close(self) -> None:
        with contextlib.suppress(PublishError):
            await self.flush()

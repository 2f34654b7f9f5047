"""Connections, the run's stream, and the publisher.

One JetStream stream per run (``STACX_<run_id>``, subjects ``stacx.<run_id>.>``, file storage).
Its duplicate window is long (a day by default) so that an actor that redoes work after a
crash and re-publishes an event with the same ``event_id`` is de-duplicated by the server.
Past the window the server accepts it again; the recorder then skips it (one row per
``event_id``, ever: ``stacx.store.recorder``).

The publisher pipelines: many publishes are in flight at once (bounded by ``max_pending``,
which is the backpressure: a caller waits when the window is full), each one's ack is checked,
and a publish that is not acknowledged raises ``PublishError`` to the caller (from ``publish``
directly, or from ``flush`` for fire-and-forget ``submit``). Nothing is dropped silently.
"""

from __future__ import annotations

import asyncio
import contextlib

import nats
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import PubAck, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from stacx.errors import PublishError
from stacx.events import Event, encode, stream_name, subject

DUPLICATE_WINDOW_S = 24 * 3600.0


async def connect(url: str, *, name: str = "stacx") -> NATS:
    servers = [u.strip() for u in url.split(",") if u.strip()]
    return await nats.connect(
        servers=servers,
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.2,
        pending_size=64 * 1024 * 1024,
        allow_reconnect=True,
    )


async def ensure_stream(js: JetStreamContext, run_id: str, *, replicas: int = 1) -> str:
    """Create the run's stream if missing; return its name."""
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


class Publisher:
    """Publishes events of one run with message-id de-duplication and bounded pipelining."""

    def __init__(self, js: JetStreamContext, run_id: str, *, max_pending: int = 4096,
                 ack_timeout: float = 10.0):
        self.js = js
        self.run_id = run_id
        self.ack_timeout = ack_timeout
        self._window = asyncio.Semaphore(max_pending)
        self._pending: set[asyncio.Future[PubAck]] = set()
        self._errors: list[PublishError] = []
        self.published = 0
        self.duplicates = 0

    async def publish(self, event: Event) -> int:
        """Publish and wait for the ack; return the stream sequence."""
        async with self._window:
            return await self._send(event)

    async def submit(self, event: Event) -> asyncio.Future[PubAck]:
        """Publish without waiting for the ack (waits only while the window is full).

        Uses JetStream's async publish (no request round trip per call). A failed or missing
        ack is raised by the next ``flush`` (and by later ``submit`` calls)."""
        if self._errors:
            raise PublishError(f"earlier publish failed: {self._errors[0]}") from self._errors[0]
        await self._window.acquire()
        try:
            fut = await self.js.publish_async(
                subject(self.run_id, event.kind), encode(event), headers={"Nats-Msg-Id": event.event_id}
            )
        except BaseException:
            self._window.release()
            raise
        self._pending.add(fut)
        fut.add_done_callback(self._done)
        return fut

    def _done(self, fut: asyncio.Future[PubAck]) -> None:
        self._pending.discard(fut)
        self._window.release()
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:
            self._errors.append(PublishError(f"publish not acknowledged: {exc!r}"))
            return
        self.published += 1
        if fut.result().duplicate:
            self.duplicates += 1

    async def _send(self, event: Event) -> int:
        subj = subject(self.run_id, event.kind)
        try:
            ack = await self.js.publish(
                subj, encode(event), timeout=self.ack_timeout, headers={"Nats-Msg-Id": event.event_id}
            )
        except Exception as exc:  # any transport/timeout/JetStream error: the caller must see it
            raise PublishError(f"publish of {event.kind} {event.event_id} to {subj} not acknowledged: {exc!r}") from exc
        if ack.duplicate:
            self.duplicates += 1
        self.published += 1
        return int(ack.seq)

    async def flush(self) -> None:
        """Wait for every submitted publish; raise the first failure, or a missing ack after
        ``ack_timeout`` without progress."""
        while self._pending:
            before = len(self._pending)
            await asyncio.wait(list(self._pending), timeout=self.ack_timeout)
            if self._pending and len(self._pending) == before:
                n = len(self._pending)
                for f in list(self._pending):
                    f.cancel()
                self._pending.clear()
                raise PublishError(f"{n} publishes not acknowledged within {self.ack_timeout}s")
        if self._errors:
            err, self._errors = self._errors[0], []
            raise err

    async def close(self) -> None:
        with contextlib.suppress(PublishError):
            await self.flush()

"""The recorder: the only writer of a run's DuckDB file, exactly once.

It pulls the run's whole stream through a durable consumer in batches, decodes each message,
and commits one DuckDB transaction per batch holding: the rows of every kind (inserted through
Arrow, one INSERT per kind), the ``_events`` index rows, any dead letters, and the new stream
position. Only after the commit does it acknowledge (AckAll on the batch's last message).

Why exactly once: on every start the durable consumer is rebuilt to deliver, in stream order,
from the committed position + 1, so a crash before a commit loses nothing (those messages come
again, first) and a crash after the commit but before the ack delivers nothing twice; any
redelivery at or below the committed position is skipped. The position lives in the same
transaction as the rows, so the two cannot disagree. Publishers' re-sends of an event are
removed earlier, by JetStream's message-id de-duplication.

Bad input: a payload that does not decode (unknown kind, malformed bytes, wrong types) goes
to ``_dead_letters`` with the decoder's reason, in the same transaction; it never stops the
recorder and is never dropped silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import duckdb
import msgspec
import pyarrow as pa
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from stacx.events import Event, decode, stream_name
from stacx.store import db
from stacx.store.schema import DEAD_SCHEMA, EVENTS_SCHEMA, TABLES, to_arrow

log = logging.getLogger(__name__)
T = TypeVar("T")

DURABLE = "recorder"


class Recorder:
    """Records one run's stream into ``<run_dir>/trace.duckdb``."""

    def __init__(self, js: JetStreamContext, run_id: str, run_dir: Path, *,
                 batch: int = 4096, fetch_timeout: float = 0.05,
                 on_commit: Callable[[int], None] | None = None):
        self.js = js
        self.run_id = run_id
        self.run_dir = Path(run_dir)
        self.batch = batch
        self.fetch_timeout = fetch_timeout
        self.stream = stream_name(run_id)
        self.on_commit = on_commit  # called with the committed position (benchmarks, progress)
        self.con: duckdb.DuckDBPyConnection | None = None
        self.position = 0  # last committed stream sequence
        self.recorded = 0
        self.dead = 0
        self._advanced = asyncio.Condition()
        self._lock = asyncio.Lock()  # one DuckDB user at a time: the insert loop or a query
        self._stop = asyncio.Event()

    # ---- lifecycle -----------------------------------------------------------------------

    def open(self) -> None:
        self.con = db.open_writer(self.run_dir)
        row = self.con.execute("select seq from _position where stream = ?", [self.stream]).fetchone()
        self.position = int(row[0]) if row else 0

    def close(self) -> None:
        if self.con is not None:
            with contextlib.suppress(duckdb.Error):
                self.con.execute("CHECKPOINT")
            self.con.close()
            self.con = None

    async def run(self) -> None:
        """Consume until ``stop()``; raises on infrastructure failure (the supervisor restarts it)."""
        if self.con is None:
            self.open()
        sub = await self._subscribe_from_position()
        try:
            while not self._stop.is_set():
                try:
                    msgs = await sub.fetch(self.batch, timeout=self.fetch_timeout)
                except (TimeoutError, NatsTimeout):
                    continue
                if msgs:
                    await self._record(msgs)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    def stop(self) -> None:
        self._stop.set()

    async def _subscribe_from_position(self) -> JetStreamContext.PullSubscription:
        """(Re)create the durable consumer so it delivers, in order, everything after `position`.

        Why: messages fetched by a killed recorder but never acknowledged are redelivered by
        JetStream only after the ack wait, i.e. after newer messages. Skipping sequences at or
        below the committed position would then drop the older ones for good. The committed
        position in DuckDB is the truth, so the consumer is rebuilt from it on every start."""
        with contextlib.suppress(NotFoundError):
            await self.js.delete_consumer(self.stream, DURABLE)
        await self.js.add_consumer(self.stream, ConsumerConfig(
            durable_name=DURABLE,
            filter_subject=f"stacx.{self.run_id}.>",
            ack_policy=AckPolicy.ALL,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self.position + 1,
            ack_wait=300.0,
            max_ack_pending=-1,
            max_waiting=16,
        ))
        return await self.js.pull_subscribe_bind(DURABLE, stream=self.stream)

    # ---- the batch transaction -----------------------------------------------------------

    async def _record(self, msgs: list[Msg]) -> None:
        by_kind: dict[str, list[Event]] = defaultdict(list)
        seqs: dict[str, list[int]] = defaultdict(list)
        index: list[tuple[int, str, str, str, float, str | None]] = []
        dead: list[tuple[int, str, str, bytes, float]] = []
        last_seq = self.position
        for m in msgs:
            seq = int(m.metadata.sequence.stream)
            if seq <= self.position:
                continue  # committed before a crash; this is a redelivery
            last_seq = max(last_seq, seq)
            try:
                ev = decode(m.data)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                dead.append((seq, m.subject, f"{type(exc).__name__}: {exc}", m.data, time.time()))
                continue
            by_kind[ev.kind].append(ev)
            seqs[ev.kind].append(seq)
            index.append((seq, ev.event_id, ev.kind, ev.run_id, ev.ts, getattr(ev, "episode_id", None)))
        if last_seq > self.position:
            tables = {k: to_arrow(k, evs, seqs[k]) for k, evs in by_kind.items()}
            async with self._lock:
                await asyncio.to_thread(self._commit, tables, index, dead, last_seq)
            self.recorded += len(index)
            self.dead += len(dead)
            async with self._advanced:
                self.position = last_seq
                self._advanced.notify_all()
            if self.on_commit is not None:
                self.on_commit(last_seq)
        await msgs[-1].ack()  # AckAll: everything up to here is durable

    def _commit(self, tables: dict[str, pa.Table], index: list[tuple[int, str, str, str, float, str | None]],
                dead: list[tuple[int, str, str, bytes, float]], last_seq: int) -> None:
        con = self.con
        assert con is not None
        con.execute("BEGIN TRANSACTION")
        try:
            for kind, tbl in tables.items():
                con.register("_batch", tbl)
                con.execute(f'INSERT INTO "{TABLES[kind].name}" SELECT * FROM _batch')
                con.unregister("_batch")
            if index:
                con.register("_batch", pa.Table.from_arrays(
                    [pa.array(col, type=f.type) for col, f in zip(zip(*index, strict=True), EVENTS_SCHEMA, strict=True)],
                    schema=EVENTS_SCHEMA))
                con.execute("INSERT INTO _events SELECT * FROM _batch")
                con.unregister("_batch")
            if dead:
                con.register("_batch", pa.Table.from_arrays(
                    [pa.array(col, type=f.type) for col, f in zip(zip(*dead, strict=True), DEAD_SCHEMA, strict=True)],
                    schema=DEAD_SCHEMA))
                con.execute("INSERT INTO _dead_letters SELECT * FROM _batch")
                con.unregister("_batch")
            con.execute(
                "INSERT INTO _position VALUES (?, ?) ON CONFLICT (stream) DO UPDATE SET seq = excluded.seq",
                [self.stream, last_seq],
            )
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    # ---- readers -------------------------------------------------------------------------

    async def wait_for(self, seq: int, timeout: float | None = None) -> None:
        """Return once every event up to stream sequence `seq` is committed."""
        async with self._advanced:
            await asyncio.wait_for(self._advanced.wait_for(lambda: self.position >= seq), timeout)

    async def query(self, sql: str, params: list[object] | None = None) -> pa.Table:
        """Run SQL (views included) on the writer's connection, between batches."""
        return await self.read(lambda con: con.sql(sql, params=params).to_arrow_table())

    async def read(self, fn: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
        if self.con is None:
            self.open()
        con = self.con
        assert con is not None
        async with self._lock:
            return await asyncio.to_thread(lambda: fn(con.cursor()))

"""The recorder: the only writer of a run's DuckDB file, one transaction per fetched batch (rows,
``_events``, dead letters, stream position), acknowledged after the commit. Every event is
written exactly once (one row per ``event_id``, ever); an undecodable payload goes to
``_dead_letters``, never stops it. Design: docs/concepts/events.md#the-recorder
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import duckdb
import msgspec
import nats.errors
import pyarrow as pa
import pyarrow.compute as pc
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from stacx.events import Event, stream_name
from stacx.store import db
from stacx.store.schema import DEAD_SCHEMA, EVENTS_SCHEMA, TABLES, to_arrow
from stacx.store.seen_ids import SeenIds
from stacx.wire import decode_wire, split_batch

log = logging.getLogger(__name__)
T = TypeVar("T")

DURABLE = "recorder"
IndexRow = tuple[int, str, str, str, float, str | None]  # an ``_events`` row
DeadRow = tuple[int, str, str, bytes, float]  # a ``_dead_letters`` row


@dataclass(frozen=True)
class _Batch:
    """A fetched batch, decoded: rows per table, index rows, dead letters, its last sequence."""

    tables: dict[str, pa.Table]  # by DuckDB table name; every one has an event_id column
    index: list[IndexRow]
    dead: list[DeadRow]
    repeats: list[tuple[str, int]]  # (event_id, seq) repeated inside the batch
    maybe_seen: list[str]  # ids that may be in the log already: looked up in the commit
    last_seq: int


class Recorder:
    """Records one run's stream into ``<run_dir>/trace.duckdb``."""

    def __init__(
        self,
        js: JetStreamContext,
        run_id: str,
        run_dir: Path,
        *,
        batch: int = 200,
        fetch_timeout: float = 0.25,
        drain_s: float = 0.002,
        checkpoint_bytes: int = 16 << 20,
        idle_checkpoint_bytes: int = 1 << 20,
        compact_after: int = 16,
        on_commit: Callable[[int], None] | None = None,
    ):
        self.js = js
        self.run_id = run_id
        self.run_dir = Path(run_dir)
        # messages per fetch: each can hold up to a publisher batch of events (<= 256 KiB) or a
        # foreign 1 MiB payload; 200 of them stay under the subscription's 256 MiB pending
        # limit, past which the client drops deliveries (the gap check below catches it anyway)
        self.batch = batch
        # what a fetch asks for now: halved when deliveries were lost (a server that cuts a
        # client whose pending bytes pass its max_pending would cut every pull that size
        # again), grown back by one per clean batch
        self.pull = batch
        self.fetch_timeout = fetch_timeout  # idle long poll for the first message of a batch
        self.drain_s = drain_s  # then at most this long for more that are already on their way
        self.stream = stream_name(run_id)
        self.checkpoint_bytes = checkpoint_bytes
        self.idle_checkpoint_bytes = idle_checkpoint_bytes
        self.compact_after = compact_after
        self._unvacuumed = 0  # checkpoints since the last one that vacuumed
        self.on_commit = on_commit  # called with the committed position (benchmarks, progress)
        self.con: duckdb.DuckDBPyConnection | None = None
        self.seen: SeenIds | None = None
        self.position = 0  # last committed stream sequence
        self._taken = 0  # last stream sequence handed to a commit (in flight or done)
        self.recorded = 0
        self.dead = 0
        self.duplicates = 0  # events skipped because their event_id was already recorded
        self.gaps = 0  # batches dropped and re-read because a delivery was missing
        self.lost = 0  # consumer rebuilds because deliveries were lost with nothing after them
        self._suspect = 0  # the consumer's last delivered sequence at an idle poll, if past ours
        self._advanced = asyncio.Condition()
        self._lock = asyncio.Lock()  # one writer at a time: a commit or a checkpoint
        self._gate = _ReadGate()  # queries run beside a commit, each on a cursor of its own
        self._cursors: asyncio.Queue[duckdb.DuckDBPyConnection] = asyncio.Queue()
        self._stop = asyncio.Event()

    # ---- lifecycle -----------------------------------------------------------------------

    def open(self) -> None:
        self.con = db.open_writer(self.run_dir)
        if (os.cpu_count() or 1) <= 2:
            # DuckDB's parallel workers only contend with NATS and the publishers for two cores
            # on inserts of a few hundred rows (here p50 24 vs 28-35 ms, p99 72 vs 78-91 ms at
            # 3k events/s, tools/bench/events.py); it also runs queries of a live run serially
            self.con.execute("SET threads = 1")
        self.con.execute("SET checkpoint_threshold = '1TB'")  # see "Checkpoints" above
        self.con.execute("SET max_vacuum_tasks = 0")
        row = self.con.execute(
            "select seq from _position where stream = ?", [self.stream]
        ).fetchone()
        if row is None:  # one row per stream from the start, so a commit is a plain UPDATE
            self.con.execute("INSERT INTO _position VALUES (?, 0)", [self.stream])
        self.position = self._taken = int(row[0]) if row else 0
        self.seen = SeenIds(self.con)
        self._cursors = asyncio.Queue()  # made here, in one thread: DuckDB's cursor() is not
        for _ in range(READERS):  # to be called beside a statement running on `con`
            self._cursors.put_nowait(db.writer_cursor(self.con))

    def close(self) -> None:
        while not self._cursors.empty():
            self._cursors.get_nowait().close()
        if self.con is not None:
            with contextlib.suppress(duckdb.Error):
                self.con.execute("CHECKPOINT")
            self.con.close()
            self.con = None

    async def run(self) -> None:
        """Consume until ``stop()``; raise on infra failure (the supervisor restarts it)."""
        if self.con is None:
            self.open()
        self._taken = self.position  # a restart after a failed commit re-reads what it held
        sub = await self._subscribe_from_position()
        fresh = True  # the first delivery after a (re)build may start past a hole in the stream
        commit: asyncio.Task[None] | None = None  # the batch committing now, in a worker thread
        try:
            while not self._stop.is_set():
                msgs = await self._fetch(sub)
                if not msgs:
                    if commit is not None:
                        await commit
                        commit = None
                    if await self._lost_deliveries():
                        sub, fresh = await self._reread(sub), True
                        continue
                    wal = self._wal_bytes()
                    if self._unvacuumed >= self.compact_after and wal > 0:  # (DuckDB skips a
                        await self._checkpoint(vacuum=True)  # checkpoint with nothing to write)
                    elif wal >= self.idle_checkpoint_bytes:
                        await self._checkpoint()
                    continue
                self._suspect = 0
                if fresh:
                    await self._skip_hole(msgs)
                if self._gap(msgs):
                    if commit is not None:
                        await commit  # it holds no missing delivery: it passed this check
                        commit = None
                    sub, fresh = await self._reread(sub), True
                    continue
                fresh = False
                self.pull = min(self.batch, self.pull + 1)
                batch = self._prepare(msgs)  # decoded while the previous batch commits
                if commit is not None:
                    await commit
                commit = asyncio.create_task(self._record(msgs, batch))
            if commit is not None:
                await commit
                commit = None
        finally:
            if commit is not None:  # leaving on an error: let the commit in flight finish
                with contextlib.suppress(Exception):
                    await commit
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _fetch(self, sub: JetStreamContext.PullSubscription) -> list[Msg]:
        """The next messages: wait (up to ``fetch_timeout``) for one, then take up to ``pull``
        that are there or arrive within ``drain_s``; [] when none came."""
        try:
            msgs = await sub.fetch(1, timeout=self.fetch_timeout)
        except (TimeoutError, NatsTimeout):
            return []
        if self.pull > 1:
            with contextlib.suppress(TimeoutError, NatsTimeout):
                msgs += await sub.fetch(self.pull - 1, timeout=self.drain_s)
        return msgs

    async def _reread(
        self, sub: JetStreamContext.PullSubscription
    ) -> JetStreamContext.PullSubscription:
        """Deliveries were lost: pull half as much, rebuild the consumer from `position`."""
        self.pull = max(1, self.pull // 2)
        self._taken = self.position
        self._suspect = 0
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        return await self._subscribe_from_position()

    def stop(self) -> None:
        self._stop.set()

    async def _lost_deliveries(self) -> bool:
        """True if, idle and all committed, the consumer has delivered past the committed position
        on two polls in a row (one delivery may be on its way at the first), or is gone:
        deliveries were lost with nothing after them. An unanswered poll does not count."""
        try:
            info = await self.js.consumer_info(
                self.stream, DURABLE, timeout=max(1.0, 4 * self.fetch_timeout)
            )
        except NotFoundError:
            log.warning("recorder %s: its consumer is gone; rebuilding it", self.stream)
            return True
        except (TimeoutError, nats.errors.Error):
            return False
        delivered = int(info.delivered.stream_seq)
        if delivered <= self.position:
            self._suspect = 0
            return False
        if self._suspect != delivered:
            self._suspect = delivered  # ask again at the next idle poll
            return False
        log.warning(
            "recorder %s: the consumer delivered up to stream sequence %d, nothing after "
            "%d arrived; re-reading from %d",
            self.stream,
            delivered,
            self.position,
            self.position + 1,
        )
        self.lost += 1
        return True

    async def _skip_hole(self, msgs: list[Msg]) -> None:
        """Move the position past a hole in the stream (purged or deleted messages) before the
        first delivery after a rebuild, only if the stream really holds none of the run's
        messages there; otherwise they were lost on the way and the gap check re-reads them."""
        expect, first = self._taken + 1, int(msgs[0].metadata.sequence.stream)
        if first <= expect:
            return
        try:
            nxt = await self.js.get_msg(
                self.stream, seq=expect, subject=f"stacx.{self.run_id}.>", next=True
            )
        except NotFoundError:
            return  # (the delivered one is there: a lookup that finds nothing decides nothing)
        except (TimeoutError, nats.errors.Error):
            return  # unanswered: the gap check re-reads, and this is asked again
        if int(nxt.seq or 0) >= first:
            log.info(
                "recorder %s: stream sequences %d-%d hold none of the run's messages",
                self.stream,
                expect,
                first - 1,
            )
            self._taken = first - 1

    def _gap(self, msgs: list[Msg]) -> bool:
        """True if a delivery is missing before or inside this batch: AckAll past it would lose
        it, so the batch is cut there and the consumer rebuilt from the committed position."""
        expect = self._taken + 1
        for m in msgs:
            seq = int(m.metadata.sequence.stream)
            if seq < expect:
                continue  # a redelivery of what is committed
            if seq > expect:
                log.warning(
                    "recorder %s: stream sequence %d delivered, %d expected; re-reading from %d",
                    self.stream,
                    seq,
                    expect,
                    self.position + 1,
                )
                self.gaps += 1
                return True
            expect = seq + 1
        return False

    async def _subscribe_from_position(self) -> JetStreamContext.PullSubscription:
        """(Re)create the durable consumer to deliver, in order, everything after `position` (the
        committed truth): unacked messages would otherwise come back only after newer ones."""
        with contextlib.suppress(NotFoundError):
            await self.js.delete_consumer(self.stream, DURABLE)
        await self.js.add_consumer(
            self.stream,
            ConsumerConfig(
                durable_name=DURABLE,
                filter_subject=f"stacx.{self.run_id}.>",
                ack_policy=AckPolicy.ALL,
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=self.position + 1,
                ack_wait=300.0,
                max_ack_pending=-1,
                max_waiting=16,
            ),
        )
        return await self.js.pull_subscribe_bind(DURABLE, stream=self.stream)

    # ---- the batch transaction -----------------------------------------------------------

    def _prepare(self, msgs: list[Msg]) -> _Batch | None:
        """Decode a fetched batch into Arrow tables (None: nothing new in it) and mark its
        sequences as taken. Runs on the event loop while the previous batch commits."""
        by_kind: dict[str, list[Event]] = defaultdict(list)
        seqs: dict[str, list[int]] = defaultdict(list)
        index: list[IndexRow] = []
        dead: list[DeadRow] = []
        last_seq = self._taken
        batch_ids: set[str] = set()
        repeats: list[tuple[str, int]] = []  # (event_id, seq) seen earlier in this batch
        for m in msgs:
            seq = int(m.metadata.sequence.stream)
            if seq <= self._taken:
                continue  # committed (or committing) already; this is a redelivery
            last_seq = max(last_seq, seq)
            events: list[Event]
            try:
                events = decode_wire(m.data)  # token arrays stay packed bytes
            except (msgspec.DecodeError, msgspec.ValidationError):
                events = self._salvage(m, seq, dead)
            for ev in events:
                if ev.event_id in batch_ids:
                    repeats.append((ev.event_id, seq))
                    continue
                batch_ids.add(ev.event_id)
                by_kind[ev.kind].append(ev)
                seqs[ev.kind].append(seq)
                index.append(
                    (seq, ev.event_id, ev.kind, ev.run_id, ev.ts, getattr(ev, "episode_id", None))
                )
        if last_seq <= self._taken:
            return None
        self._taken = last_seq
        assert self.seen is not None
        hashes = self.seen.hashes([r[1] for r in index])
        maybe_seen = [
            r[1] for r, hit in zip(index, self.seen.maybe_seen(hashes), strict=True) if hit
        ]
        self.seen.add(hashes)
        tables = {TABLES[k].name: to_arrow(k, evs, seqs[k]) for k, evs in by_kind.items()}
        if index:
            tables["_events"] = _rows(index, EVENTS_SCHEMA)
        return _Batch(tables, index, dead, repeats, maybe_seen, last_seq)

    async def _record(self, msgs: list[Msg], batch: _Batch | None) -> None:
        if batch is not None:
            async with self._lock:
                written = await asyncio.to_thread(self._commit, batch)
            kept = {r[1] for r in written}
            repeats = batch.repeats + [(r[1], r[0]) for r in batch.index if r[1] not in kept]
            if repeats:
                self.duplicates += len(repeats)
                log.warning(
                    "recorder %s: %d event(s) with an already recorded event_id skipped "
                    "(e.g. %s at stream sequence %d); %d so far",
                    self.stream,
                    len(repeats),
                    *repeats[0],
                    self.duplicates,
                )
            self.recorded += len(written)
            self.dead += len(batch.dead)
            async with self._advanced:
                self.position = batch.last_seq
                self._advanced.notify_all()
            if self.on_commit is not None:
                self.on_commit(batch.last_seq)
        await msgs[-1].ack()  # AckAll: everything up to here is durable
        if self._wal_bytes() >= self.checkpoint_bytes:
            await self._checkpoint()

    def _wal_bytes(self) -> int:
        try:
            return db.wal_path(self.run_dir).stat().st_size
        except FileNotFoundError:
            return 0

    async def _checkpoint(self, vacuum: bool = False) -> None:
        con = self.con
        assert con is not None

        def checkpoint() -> None:
            if vacuum:
                con.execute("SET max_vacuum_tasks = 100")  # DuckDB's default
            try:
                con.execute("CHECKPOINT")
            finally:
                if vacuum:
                    con.execute("SET max_vacuum_tasks = 0")

        async with self._lock, self._gate.alone():  # no query open beside a checkpoint
            await asyncio.to_thread(checkpoint)
        self._unvacuumed = 0 if vacuum else self._unvacuumed + 1

    @staticmethod
    def _salvage(m: Msg, seq: int, dead: list[DeadRow]) -> list[Event]:
        """A message that does not decode as a whole: keep its good events, dead-letter the
        rest (each with its own bytes and reason), or the whole payload if it is no batch."""
        try:
            parts = split_batch(m.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            dead.append((seq, m.subject, f"{type(exc).__name__}: {exc}", m.data, time.time()))
            return []
        good: list[Event] = []
        for part in parts:
            try:
                good += decode_wire(part)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                dead.append((seq, m.subject, f"{type(exc).__name__}: {exc}", part, time.time()))
        return good

    def _commit(self, batch: _Batch) -> list[IndexRow]:
        """One transaction: rows, index, dead letters, position; returns the new ids' index rows."""
        con = self.con
        assert con is not None
        tables, index = batch.tables, batch.index
        con.execute("BEGIN TRANSACTION")
        try:
            if batch.maybe_seen:
                ids = pa.table({"event_id": pa.array(batch.maybe_seen, pa.string())})
                recorded = {r[0] for r in _from_arrow(con, _RECORDED_IDS, ids).fetchall()}
                if recorded:
                    old = pa.array(list(recorded), pa.string())
                    index = [r for r in index if r[1] not in recorded]
                    tables = {
                        k: t.filter(pc.invert(pc.is_in(t["event_id"], value_set=old)))
                        for k, t in tables.items()
                    }
            # BY NAME: in a file older than a field, its column came after `_seq` (ALTER TABLE)
            for name, rows in tables.items():
                _from_arrow(
                    con,
                    f"INSERT INTO {db.quote_ident(name)} BY NAME SELECT * FROM arrow_rows",
                    rows,
                )
            if batch.dead:
                _from_arrow(
                    con,
                    "INSERT INTO _dead_letters SELECT * FROM arrow_rows",
                    _rows(batch.dead, DEAD_SCHEMA),
                )
            con.execute(
                "UPDATE _position SET seq = ? WHERE stream = ?", [batch.last_seq, self.stream]
            )
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        return index

    # ---- readers -------------------------------------------------------------------------

    async def wait_for(self, seq: int, timeout: float | None = None) -> None:
        """Return once every event up to stream sequence `seq` is committed."""
        async with self._advanced:
            await asyncio.wait_for(self._advanced.wait_for(lambda: self.position >= seq), timeout)

    async def query(
        self, sql: str, params: Sequence[object] | Mapping[str, object] | None = None
    ) -> pa.Table:
        """Run SQL (views included) on the log as committed when it starts."""
        return await self.read(lambda con: con.sql(sql, params=params).to_arrow_table())

    async def read(self, fn: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
        """`fn` on a cursor of the writer's database, in a thread, beside commits (DuckDB's MVCC: a
        query sees the commits done when it starts) and other queries, never a checkpoint."""
        if self.con is None:
            self.open()
        async with self._gate.shared():
            cur = await self._cursors.get()
            try:
                return await asyncio.to_thread(fn, cur)
            finally:
                self._cursors.put_nowait(cur)


READERS = 4  # queries at once (the launcher's query service, progress, metrics, local actors)


class _ReadGate:
    """Any number of readers at once, or one holder alone (a checkpoint), who waits for the
    readers in progress and keeps new ones out."""

    def __init__(self) -> None:
        self._readers = 0
        self._alone = False
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: not self._alone)
            self._readers += 1
        try:
            yield
        finally:
            async with self._changed:
                self._readers -= 1
                self._changed.notify_all()

    @contextlib.asynccontextmanager
    async def alone(self) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: not self._alone)
            self._alone = True
            await self._changed.wait_for(lambda: self._readers == 0)
        try:
            yield
        finally:
            async with self._changed:
                self._alone = False
                self._changed.notify_all()


def _rows(rows: Sequence[tuple[object, ...]], schema: pa.Schema) -> pa.Table:
    columns = zip(schema.names, zip(*rows, strict=True), strict=True)
    return pa.Table.from_pydict(dict(columns), schema=schema)


_RECORDED_IDS = (
    "SELECT DISTINCT event_id FROM _events WHERE event_id IN (SELECT event_id FROM arrow_rows)"
)


def _from_arrow(
    con: duckdb.DuckDBPyConnection, sql: str, arrow_rows: pa.Table
) -> duckdb.DuckDBPyConnection:
    """Run `sql`, which reads the Arrow table ``arrow_rows`` from this frame's locals (DuckDB's
    replacement scan, cheaper than register + INSERT + unregister)."""
    return con.execute(sql)

"""The recorder: every event exactly once, dead letters for bad input, kill -9 safe."""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import msgspec

from stacx import events as ev
from stacx import wire
from stacx.actors.run import supervise_recorder
from stacx.bus.client import Publisher, connect, ensure_stream
from stacx.bus.server import EmbeddedNats
from stacx.events import stream_name
from stacx.store import db
from stacx.store.recorder import Recorder
from stacx.store.schema import TABLES
from stacx.store.seen_ids import SeenIds
from tests.backbone.factory import episode_events


async def _publish_all(url: str, run_id: str, events: list, pause_every: int = 0) -> int:
    """Publish (batched: bursts of one kind share a message); return the stream's last seq."""
    nc = await connect(url)
    js = nc.jetstream()
    await ensure_stream(js, run_id)
    pub = Publisher(js, run_id, max_pending=512)
    for i, e in enumerate(events):
        await pub.submit(e)
        if pause_every and i % pause_every == 0:
            await asyncio.sleep(0.01)
    await pub.flush()
    last = int((await js.stream_info(stream_name(run_id))).state.last_seq)
    await nc.drain()
    return last


def _counts(run_dir: Path) -> tuple[int, int, dict[str, int]]:
    con = duckdb.connect(str(db.db_path(run_dir)), read_only=True)
    total, distinct = con.execute(
        "select count(*), count(distinct event_id) from _events"
    ).fetchone()
    kinds = dict(con.execute("select kind, count(*) from _events group by 1").fetchall())
    con.close()
    return total, distinct, kinds


async def test_records_every_event_once_with_typed_columns(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    run_id, run_dir = "r1", tmp_path / "run"
    events = episode_events(run_id, 20)
    await _publish_all(nats_server.url, run_id, events)
    # re-sent in other batches (other message ids): de-duplicated by event_id in the recorder
    last = await _publish_all(nats_server.url, run_id, events[:30])
    nc = await connect(nats_server.url)
    rec = Recorder(nc.jetstream(), run_id, run_dir)
    task = asyncio.create_task(rec.run())
    await rec.wait_for(last, timeout=30)
    rec.stop()
    await task
    rec.close()
    await nc.drain()
    total, distinct, kinds = _counts(run_dir)
    assert total == distinct == len(events)
    assert kinds["TurnGenerated"] == 60 and kinds["EpisodeStarted"] == 20
    con = duckdb.connect(str(db.db_path(run_dir)), read_only=True)  # plain duckdb, no STACX code
    typ = con.execute(
        "select data_type from information_schema.columns where table_name='turn_generated' "
        "and column_name='output_ids'"
    ).fetchone()
    assert typ == ("INTEGER[]",)
    first = events[1]
    row = con.execute(
        "select output_ids, logprobs from turn_generated where event_id = ?", [first.event_id]
    ).fetchone()
    assert row[0] == first.output_ids and row[1] == first.logprobs
    assert con.execute("select count(*) from episodes").fetchone() == (
        20,
    )  # views persisted in the file


async def test_bad_payloads_go_to_dead_letters(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    run_id, run_dir = "r2", tmp_path / "run"
    nc = await connect(nats_server.url)
    js = nc.jetstream()
    await ensure_stream(js, run_id)
    await js.publish(
        f"stacx.{run_id}.Mystery", msgspec.msgpack.encode({"kind": "Mystery", "run_id": run_id})
    )
    await js.publish(f"stacx.{run_id}.RewardAssigned", b"\xc1 not msgpack")
    await js.publish(
        f"stacx.{run_id}.RewardAssigned",
        msgspec.msgpack.encode(
            {"kind": "RewardAssigned", "run_id": run_id, "episode_id": "e", "reward": "high"}
        ),
    )
    last = await _publish_all(nats_server.url, run_id, episode_events(run_id, 1))
    rec = Recorder(js, run_id, run_dir)
    task = asyncio.create_task(rec.run())
    await rec.wait_for(last, timeout=30)
    rec.stop()
    await task
    reasons = [
        r[0] for r in rec.con.execute("select reason from _dead_letters order by _seq").fetchall()
    ]
    rec.close()
    await nc.drain()
    assert len(reasons) == 3
    assert "Mystery" in reasons[0] and "reward" in reasons[2]
    total, _, _ = _counts(run_dir)
    assert total == 12  # the good events all landed after the bad ones


async def _record_until(
    js: object,
    run_id: str,
    run_dir: Path,
    seq: int,
    opened: Callable[[Recorder], None] | None = None,
) -> Recorder:
    """Record up to stream sequence `seq`; `opened` sees the recorder once its file is open."""
    rec = Recorder(js, run_id, run_dir)  # type: ignore[arg-type]
    if opened is not None:
        rec.open()
        opened(rec)
    task = asyncio.create_task(rec.run())
    await rec.wait_for(seq, timeout=30)
    rec.stop()
    await task
    rec.close()
    return rec


async def test_a_file_older_than_a_field_is_appended_to_column_by_column(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    # a run resumed on a file made before `prefix_len` and `versions` existed: opening it adds
    # them after `_seq`, so rows go in by column name, never by position
    run_id, run_dir = "r-old", tmp_path / "run"
    run_dir.mkdir()
    cols = ", ".join(
        f'"{c.name}" {c.sql_type}'
        for c in TABLES["TurnGenerated"].columns
        if c.name not in ("prefix_len", "versions")
    )
    con = duckdb.connect(str(db.db_path(run_dir)))
    con.execute(f"CREATE TABLE turn_generated ({cols})")
    con.close()
    turn = ev.TurnGenerated(
        run_id=run_id,
        episode_id="e",
        turn=1,
        prompt_ids=[5],
        output_ids=[6, 7],
        prefix_len=4,
        version_starts=[0, 1],
        versions=[2, 3],
    )
    last = await _publish_all(nats_server.url, run_id, [turn])
    nc = await connect(nats_server.url)
    await _record_until(nc.jetstream(), run_id, run_dir, last)
    await nc.drain()
    con = duckdb.connect(str(db.db_path(run_dir)), read_only=True)
    row = con.execute("select _seq, prefix_len, version_starts, versions from turn_generated")
    assert row.fetchall() == [(last, 4, [0, 1], [2, 3])]


async def test_a_repeated_event_id_is_recorded_once_whenever_it_arrives(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    # JetStream de-duplicates by Nats-Msg-Id only inside its window; a redo after that (or
    # under another message id) reaches the stream, and the recorder must still write it once.
    run_id, run_dir = "r4", tmp_path / "run"
    nc = await connect(nats_server.url)
    js = nc.jetstream()
    await ensure_stream(js, run_id)
    redo = ev.EpisodeFinished(
        run_id=run_id,
        episode_id="ep",
        stop_reason=ev.StopReason.SUBMITTED,
        event_id=ev.derive_id(run_id, "ep", "finished"),
    )
    subj, data = ev.subject(run_id, redo.kind), wire.encode(redo)
    pub = Publisher(js, run_id)
    await pub.publish(redo)
    await js.publish(subj, data, headers={"Nats-Msg-Id": "another-id"})  # same batch
    other = ev.RewardAssigned(run_id=run_id, episode_id="ep", reward=1.0)
    await pub.publish(other)
    rec = await _record_until(js, run_id, run_dir, 3)
    assert rec.duplicates == 1
    await js.publish(subj, data)  # no message id at all, in a later batch: checked against the file
    rec = await _record_until(js, run_id, run_dir, 4)  # a fresh recorder: the ids are in the file
    assert rec.duplicates == 1
    await nc.drain()
    con = duckdb.connect(str(db.db_path(run_dir)), read_only=True)
    assert con.execute(
        "select count(*) from episode_finished where event_id = ?", [redo.event_id]
    ).fetchone() == (1,)
    assert con.execute("select count(*), count(distinct event_id) from _events").fetchone() == (
        2,
        2,
    )
    assert con.execute("select seq from _position").fetchone() == (4,)  # skipped, not stuck
    con.close()


async def test_a_redo_long_after_and_across_restarts_is_recorded_once(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    # The ids of a file written by an earlier recorder are found again after a restart (the
    # id filter is seeded from the file), also when the file still has the older version's
    # ``_event_ids`` table (which goes on open), and however many batches lie in between.
    run_id, run_dir = "r5", tmp_path / "run"
    events = episode_events(run_id, 30)
    last = await _publish_all(nats_server.url, run_id, events[:12])
    nc = await connect(nats_server.url)
    js = nc.jetstream()
    await _record_until(js, run_id, run_dir, last)
    con = duckdb.connect(str(db.db_path(run_dir)))  # as the previous STACX version left it
    con.execute("create table _event_ids (event_id varchar primary key)")
    con.execute("insert into _event_ids select event_id from _events")
    con.execute("insert into _meta values ('event_ids', 'v1')")
    con.close()
    last = await _publish_all(nats_server.url, run_id, events[12:])
    await _record_until(js, run_id, run_dir, last)
    for e in (events[0], events[-1]):  # late redos under fresh message ids, one batch each
        await js.publish(
            ev.subject(run_id, e.kind),
            wire.encode(e),
            headers={"Nats-Msg-Id": f"redo-{e.event_id}"},
        )
        last += 1
        rec = await _record_until(js, run_id, run_dir, last)
        assert rec.duplicates == 1
    await nc.drain()
    total, distinct, _ = _counts(run_dir)
    assert total == distinct == len(events)
    con = duckdb.connect(str(db.db_path(run_dir)), read_only=True)
    left = con.execute(
        "select count(*) from duckdb_tables() where table_name = '_event_ids'"
    ).fetchone()
    marker = con.execute("select count(*) from _meta where key = 'event_ids'").fetchone()
    con.close()
    assert left == marker == (0,)


async def test_an_id_the_filter_flags_but_the_file_lacks_is_recorded(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    # The id filter only says which ids to look up; a flagged id that is not in the file (a
    # hash collision, or a commit that failed after its ids were added) is still written.
    run_id, run_dir = "r7", tmp_path / "run"
    nc = await connect(nats_server.url)
    js = nc.jetstream()
    await ensure_stream(js, run_id)
    fresh = ev.RewardAssigned(run_id=run_id, episode_id="ep", reward=1.0)
    await Publisher(js, run_id).publish(fresh)

    def flag(rec: Recorder) -> None:
        assert rec.seen is not None
        rec.seen.add(rec.seen.hashes([fresh.event_id]))

    rec = await _record_until(js, run_id, run_dir, 1, opened=flag)
    await nc.drain()
    assert (rec.recorded, rec.duplicates) == (1, 0)
    assert _counts(run_dir)[:2] == (1, 1)


async def test_checkpoints_skip_vacuum_until_the_stream_is_idle(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    # every commit of a few episodes checkpoints (a 20 kB threshold) without vacuum, so each
    # leaves a row group per table; once the stream is idle with something in the WAL (a late
    # redo, too small to checkpoint), one checkpoint vacuums them into one
    run_id, run_dir = "r8", tmp_path / "run"
    events = episode_events(run_id, 40)
    nc = await connect(nats_server.url)
    js = nc.jetstream()
    await ensure_stream(js, run_id)
    rec = Recorder(js, run_id, run_dir, checkpoint_bytes=20_000, compact_after=4)  # type: ignore[arg-type]
    task = asyncio.create_task(rec.run())

    def row_groups() -> int:
        assert rec.con is not None
        (n,) = rec.con.execute(
            "select count(distinct row_group_id) from pragma_storage_info('reward_assigned')"
        ).fetchone()
        return int(n)

    seen = []
    for i in range(0, len(events), 48):  # a few episodes per commit, one after the other
        last = await _publish_all(nats_server.url, run_id, events[i : i + 48])
        await rec.wait_for(last, timeout=30)
        seen.append(await rec.read(lambda con: row_groups()))
    await _publish_all(nats_server.url, run_id, events[:1])  # a late redo: idle after it

    async def compacted() -> None:
        while rec._unvacuumed:  # noqa: ASYNC110 (the recorder signals no event on a checkpoint)
            await asyncio.sleep(0.05)

    await asyncio.wait_for(compacted(), timeout=30)
    rec.stop()
    await task
    assert seen[-1] >= 4 and row_groups() == 1
    rec.close()
    await nc.drain()
    total, distinct, _ = _counts(run_dir)
    assert total == distinct == len(events)


def test_the_id_filter_holds_every_id_it_was_given(tmp_path: Path) -> None:
    # past its merge point (the recent set folded into the sorted array) and across a re-open
    con = db.open_writer(tmp_path / "run")
    seen = SeenIds(con)
    ids = [ev.new_id() for _ in range(70_000)]
    for i in range(0, len(ids), 1000):
        seen.add(seen.hashes(ids[i : i + 1000]))
    assert len(seen) == len(ids) and len(seen._sorted) > 65_536  # merged once
    assert seen.maybe_seen(seen.hashes(ids)).all()
    assert not seen.maybe_seen(seen.hashes([ev.new_id() for _ in range(1000)])).any()
    con.execute("insert into _events (event_id) select unnest(?)", [ids[:10]])
    again = SeenIds(con)
    assert again.maybe_seen(again.hashes(ids[:10])).all() and len(again) == 10
    con.close()


async def test_an_unknown_enum_value_is_dead_lettered(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    run_id, run_dir = "r6", tmp_path / "run"
    nc = await connect(nats_server.url)
    js = nc.jetstream()
    await ensure_stream(js, run_id)
    await js.publish(
        ev.subject(run_id, "EpisodeFinished"),
        msgspec.msgpack.encode(
            {
                "kind": "EpisodeFinished",
                "run_id": run_id,
                "episode_id": "e",
                "stop_reason": "gave_up",
            }
        ),
    )
    rec = await _record_until(js, run_id, run_dir, 1)
    await nc.drain()
    assert rec.dead == 1
    con = duckdb.connect(str(db.db_path(run_dir)), read_only=True)
    (reason,) = con.execute("select reason from _dead_letters").fetchone()
    con.close()
    assert "gave_up" in reason


def _spawn_recorder(
    url: str, run_id: str, run_dir: Path, until: int | None = None
) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "stacx.actors.recorder_process", url, run_id, str(run_dir)]
    if until is not None:
        args += ["--until-seq", str(until)]
    return subprocess.Popen(args, cwd=Path(__file__).resolve().parents[2])


async def test_exactly_once_under_kill_9_of_the_recorder(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """Batched messages (bursts of one kind share a message and its sequence) and a recorder
    killed -9 again and again: every event lands once."""
    run_id, run_dir = "r3", tmp_path / "run"
    events = episode_events(run_id, 400, tokens=64)  # 5,600 events
    rng = random.Random(7)
    nc = await connect(nats_server.url)
    js = nc.jetstream()
    await ensure_stream(js, run_id)
    await nc.drain()
    publishing = asyncio.create_task(_publish_all(nats_server.url, run_id, events, pause_every=200))
    kills = 0
    while not publishing.done() or kills < 4:
        proc = _spawn_recorder(nats_server.url, run_id, run_dir)
        await asyncio.sleep(rng.uniform(0.3, 1.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
    last = await publishing
    final = _spawn_recorder(nats_server.url, run_id, run_dir, until=last)
    assert await asyncio.to_thread(final.wait, 120) == 0
    total, distinct, _kinds = _counts(run_dir)
    assert (total, distinct) == (len(events), len(events))
    con = duckdb.connect(str(db.db_path(run_dir)), read_only=True)
    per_table = con.execute(
        "select count(*), count(distinct event_id) from turn_generated"
    ).fetchone()
    seq = con.execute("select seq from _position").fetchone()
    shared = con.execute(
        "select count(*) from (select _seq from _events group by 1 having count(*) > 1)"
    ).fetchone()
    con.close()
    assert per_table == (1200, 1200)
    assert seq == (last,)
    nc = await connect(nats_server.url)
    info = await nc.jetstream().stream_info(stream_name(run_id))
    await nc.drain()
    assert info.state.messages == last < len(events)  # the batched path: fewer messages than events
    assert shared[0] > 0  # events that share one message were recorded from it


async def test_a_bad_event_inside_a_batch_is_dead_lettered_and_its_neighbours_recorded(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    run_id, run_dir = "r6", tmp_path / "run"
    nc = await connect(nats_server.url)
    js = nc.jetstream()
    await ensure_stream(js, run_id)
    good = [ev.RewardAssigned(run_id=run_id, episode_id=f"ep{i}", reward=1.0) for i in range(2)]
    bad = msgspec.msgpack.encode({"kind": "RewardAssigned", "run_id": run_id, "reward": "high"})
    batch = wire.encode_batch([wire.encode(good[0]), bad, wire.encode(good[1])])
    await js.publish(ev.subject(run_id, "RewardAssigned"), batch)
    rec = await _record_until(js, run_id, run_dir, 1)
    await nc.drain()
    con = duckdb.connect(str(db.db_path(run_dir)), read_only=True)
    ids = {r[0] for r in con.execute("select event_id from reward_assigned").fetchall()}
    dead = con.execute("select _seq, payload from _dead_letters").fetchall()
    con.close()
    assert ids == {g.event_id for g in good} and rec.dead == 1
    assert dead == [(1, bad)]


class _BusyLoop(Recorder):
    """The real recorder; while it decodes its first delivery, the event loop is held (as a
    long decode or a commit on the loop holds it) and `busy()` runs: nobody reads the socket."""

    def __init__(self, *args: object, busy: Callable[[], None], **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.busy: Callable[[], None] | None = busy

    def _prepare(self, msgs):  # type: ignore[no-untyped-def]
        if self.busy is not None:
            busy, self.busy = self.busy, None
            busy()
        return super()._prepare(msgs)


async def _record_busy(
    server: EmbeddedNats, run_id: str, run_dir: Path, events: list, busy: Callable[[], None]
) -> tuple[_BusyLoop, int]:
    """Publish `events`, then record them with a busy first decode; returns the recorder (done)
    and how often its connection was re-established."""
    last = await _publish_all(server.url, run_id, events)
    nc = await connect(server.url)
    rec = _BusyLoop(nc.jetstream(), run_id, run_dir, busy=busy)
    # supervised as a run supervises it: a request that times out while the connection is
    # re-established ends run(), and it is run again
    task = asyncio.create_task(supervise_recorder(rec))
    await rec.wait_for(last, timeout=60)  # 5x shorter than the ack wait (a stalled recorder)
    rec.stop()
    await task
    rec.close()
    reconnects = int(nc.stats["reconnects"])
    await nc.close()
    return rec, reconnects


async def test_deliveries_lost_with_a_killed_server_are_read_again(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    # the recorder's pull (the whole stream, ~7 MB) is on its way when its loop gets busy; the
    # server is killed -9 and restarted meanwhile. What the kernel had buffered arrives, the
    # rest is lost, and the restarted server's consumer counts all of it as delivered: nothing
    # comes after the last delivery to show a gap, and JetStream would send the rest again only
    # after the ack wait (300 s). The recorder sees the consumer ahead of its committed position
    # while idle and re-reads from there: every event lands, once.
    # Whether anything is lost depends on timing (how much the server had sent, and had
    # counted as delivered, when it was killed): each try records every event once, and up to 8 tries are made for one that lost deliveries (about half of them do).

    def kill_and_restart() -> None:
        time.sleep(0.5)  # the server sends the rest meanwhile
        nats_server.kill()
        nats_server.start()

    tries = []
    for attempt in range(8):
        run_id, run_dir = f"r12-{attempt}", tmp_path / f"run{attempt}"
        events = episode_events(run_id, 420)  # 5,040 events, ~7 MB: more than the kernel buffers
        rec, reconnects = await _record_busy(nats_server, run_id, run_dir, events, kill_and_restart)
        assert reconnects == 1
        assert _counts(run_dir)[:2] == (len(events), len(events))
        tries.append(rec.lost + rec.gaps)
        if tries[-1]:
            break
    assert tries[-1] >= 1, f"no try lost deliveries at the kill (re-reads per try: {tries})"


async def test_deliveries_lost_to_a_slow_consumer_cut_are_read_again(tmp_path: Path) -> None:
    # a server that buffers at most 2 MB for a client (max_pending; 64 MiB by default): the
    # recorder's pulls (up to 200 messages of up to 256 KiB each) are on their way
    # when the recorder's loop gets busy, so the server cuts the connection as a slow consumer
    # and the deliveries it held are lost. After the
    # consumer is rebuilt, the first deliveries may be lost again: the first one that arrives
    # is not taken as the start of the stream (that lost events here before), and the recorder
    # halves its pulls until they fit. Every event lands, once.
    # Whether the server cuts depends on how fast it sends (a loaded machine can send too slowly
    # to pass 2 MB): each try records every event once, and up to 5 are made for one that cut.
    config = tmp_path / "nats.conf"
    config.write_text("max_pending: 2MB\n")
    log = tmp_path / "nats-store" / "nats-server.log"
    with EmbeddedNats(tmp_path / "nats-store", config=config) as server:
        for attempt in range(5):
            run_id, run_dir = f"r11-{attempt}", tmp_path / f"run{attempt}"
            events = episode_events(run_id, 300)  # 3,600 events: 5 MB in ~90 messages
            cuts = log.read_text().count("Slow Consumer Detected")
            rec, reconnects = await _record_busy(
                server, run_id, run_dir, events, lambda: time.sleep(1.0)
            )
            assert _counts(run_dir)[:2] == (len(events), len(events))
            if reconnects and log.read_text().count("Slow Consumer Detected") > cuts:
                break  # the cut happened
        else:
            raise AssertionError("the server cut the recorder in none of 5 tries")
    assert rec.lost + rec.gaps >= 1  # the recorder re-read
    assert rec.pull < rec.batch  # and asked for less at a time (a pull that size was cut)


class _DiskFullOnce(Recorder):
    """The real recorder whose first commit fails as a full disk does (ENOSPC)."""

    failed = False

    def _commit(self, *args, **kw):  # type: ignore[no-untyped-def]
        if not self.failed:
            self.failed = True
            raise OSError(28, "No space left on device")
        return super()._commit(*args, **kw)


async def test_a_restart_after_a_failed_commit_records_what_that_commit_held(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    # the commit's error ends run(); the supervisor runs it again, and the batch that did not
    # commit is read again from the committed position (not skipped as already taken)
    run_id, run_dir = "r13", tmp_path / "run"
    events = episode_events(run_id, 40)
    last = await _publish_all(nats_server.url, run_id, events)
    nc = await connect(nats_server.url)
    rec = _DiskFullOnce(nc.jetstream(), run_id, run_dir)
    task = asyncio.create_task(supervise_recorder(rec))
    await rec.wait_for(last, timeout=60)
    rec.stop()
    await task
    rec.close()
    await nc.close()
    assert rec.failed
    assert _counts(run_dir)[:2] == (len(events), len(events))
    assert rec.lost == 0  # read again at the restart, not found missing later by the idle check


async def test_a_commit_does_not_wait_for_a_query(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    # a query of the launcher (a view over the whole log) runs on a cursor of its own beside the
    # commits: the log keeps advancing while it runs, and the query sees the log as it started
    run_id, run_dir = "r9", tmp_path / "run"
    first = await _publish_all(nats_server.url, run_id, episode_events(run_id, 2))
    nc = await connect(nats_server.url)
    rec = Recorder(nc.jetstream(), run_id, run_dir)
    rec.open()
    release = threading.Event()

    def held(n: int) -> int:  # a query that runs until the test lets it end
        release.wait(60)
        return n

    assert rec.con is not None
    rec.con.create_function("held", held, [int], int)  # type: ignore[list-item]
    task = asyncio.create_task(rec.run())
    await rec.wait_for(first, timeout=30)
    count = "SELECT count(*)::INT AS n FROM _events"
    before = (await rec.query(count)).column("n").to_pylist()
    query = asyncio.create_task(rec.query("SELECT held(count(*)::INT) AS n FROM _events"))
    await asyncio.sleep(0.2)  # the query is running (it held the recorder's one lock, before)
    more = await _publish_all(nats_server.url, run_id, episode_events(run_id, 3)[-5:])
    try:
        await rec.wait_for(more, timeout=30)  # committed while the query still runs
        assert not query.done()
    finally:
        release.set()
    assert (await query).column("n").to_pylist() == before  # the log as the query started
    after = (await rec.query(count)).column("n").to_pylist()
    assert after[0] == before[0] + 5
    rec.stop()
    await task
    rec.close()
    await nc.drain()

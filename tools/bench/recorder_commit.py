"""What one recorder commit costs, outside the event loop: the recorder's own ``_commit`` (one
transaction: a row insert per kind table, ``_events``, the stream position) on a file opened as
the recorder opens it, the events of tools/bench/events.py (tools/bench/synthetic.py's mix,
256-token turns) as one message each, decoded by the recorder's own ``_prepare`` (not timed),
checkpointed when the WAL passes the recorder's threshold.

For each ``--batches`` size: the mean milliseconds per commit, microseconds per event, and the
checkpoints' seconds; the baseline is the same events in one commit (what the rows themselves
cost). Also the fixed cost of a statement here: an INSERT of one row into ``episode_started``
inside a transaction. The events bench's p99 at a steady rate is about twice the commit time of
the batch that rate fills, so this says which rate a machine can hold, without NATS beside it.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import duckdb
from nats.aio.msg import Msg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from stacx.events import Event  # noqa: E402
from stacx.store import db  # noqa: E402
from stacx.store.recorder import Recorder  # noqa: E402
from stacx.store.schema import to_arrow  # noqa: E402
from stacx.wire import encode  # noqa: E402
from tools.bench.events import make_events  # noqa: E402


def fetched(events: list[Event], first_seq: int) -> list[Msg]:
    """The events as a fetch delivers them to the recorder: one message each, in sequence."""
    return [
        Msg(
            _client=None, subject="bench", reply=f"$JS.ACK.S.recorder.1.{s}.{s}.0.0", data=encode(e)
        )
        for s, e in enumerate(events, first_seq)
    ]


def commit_all(events: list[Event], size: int) -> tuple[list[float], float]:
    """Commit `events` in batches of `size` through a fresh recorder's `_commit`; each commit's
    seconds, and the seconds of the checkpoints the recorder would have run between them."""
    with tempfile.TemporaryDirectory() as tmp:
        rec = Recorder(None, "bench", Path(tmp))  # type: ignore[arg-type]  # no stream: _commit only
        rec.open()
        assert rec.con is not None
        batches = [  # decoded and indexed by the recorder's own `_prepare`, not timed
            rec._prepare(fetched(events[i : i + size], i + 1)) for i in range(0, len(events), size)
        ]
        commits, checkpoints = [], 0.0
        for b in batches:
            assert b is not None
            t0 = time.perf_counter()
            rec._commit(b)
            commits.append(time.perf_counter() - t0)
            if rec._wal_bytes() >= rec.checkpoint_bytes:
                t0 = time.perf_counter()
                rec.con.execute("CHECKPOINT")
                checkpoints += time.perf_counter() - t0
        rec.close()
    return commits, checkpoints


def statement_floor(events: list[Event], n: int = 200) -> float:
    """Milliseconds of one single-row INSERT into a kind table, inside a transaction (median)."""
    started = [e for e in events if e.kind == "EpisodeStarted"][:1]
    with tempfile.TemporaryDirectory() as tmp:
        con = db.open_writer(Path(tmp))
        if (os.cpu_count() or 1) <= 2:
            con.execute("SET threads = 1")  # as the recorder
        arrow_rows = to_arrow("EpisodeStarted", started, [1])  # noqa: F841 (DuckDB reads it)
        con.execute("BEGIN TRANSACTION")
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            con.execute("INSERT INTO episode_started SELECT * FROM arrow_rows")
            times.append(time.perf_counter() - t0)
        con.execute("ROLLBACK")
        con.close()
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--batches", default="100,250,1000", help="events per commit, comma-separated")
    a = ap.parse_args()
    print(
        f"machine: {platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}, "
        f"duckdb {duckdb.__version__}"
    )
    events = make_events("bench", a.events)
    one, _ = commit_all(events, len(events))
    baseline_us = one[0] / len(events) * 1e6
    print(f"{len(events)} events in one commit: {one[0]:.2f} s, {baseline_us:.1f} µs per event")
    floor = statement_floor(events)
    print(f"one single-row INSERT in a transaction: {floor:.2f} ms")
    out: dict[str, object] = {
        "events": len(events),
        "one_commit_us_per_event": round(baseline_us, 1),
        "statement_floor_ms": round(floor, 3),
    }
    for size in (int(s) for s in a.batches.split(",")):
        commits, ckpt = commit_all(events, size)
        ms = statistics.mean(commits) * 1000
        us = (sum(commits) + ckpt) / len(events) * 1e6
        print(
            f"batches of {size}: {ms:.1f} ms per commit (p90 "
            f"{sorted(commits)[int(len(commits) * 0.9)] * 1000:.1f}), checkpoints {ckpt:.2f} s, "
            f"{us:.1f} µs per event with them ({us / baseline_us:.2f}x one commit)"
        )
        out[f"b{size}"] = {
            "ms_per_commit": round(ms, 2),
            "checkpoint_s": round(ckpt, 3),
            "us_per_event": round(us, 1),
            "over_one_commit": round(us / baseline_us, 2),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""Event backbone benchmark: raw JetStream publish rate vs STACX end to end, and latency.

In one run, on this machine:
  1. raw: plain nats-py ``publish_async`` of the same pre-encoded payloads into a bare stream,
     every ack awaited;
  2. end to end: the run's Publisher (message ids, ack checks, backpressure; what actors
     publish through) into the run's stream while the recorder commits every event to DuckDB,
     the run opened as ``stacx run`` opens it (stacx.launch.launcher.open_run, NATS from
     ``STACX_NATS_URL``): the recorder in-process, sharing the publishers' event loop; the
     clock stops when the last event is committed (queryable);
  3. latency: a steady 10k events/s for a few seconds; for each event, publish -> committed;
     ``--sweep 3000,5000,8000,10000`` measures each of those steady rates instead (a fresh
     run each) and reports the highest one whose p99 is within ``--p99-goal-ms``.
The events are a realistic mix (episode start, 3 turns of TurnGenerated with 256-token
prompt/output arrays and logprobs, tool call/return pairs, finish, reward).
Prints the machine and versions, then one JSON line:
{raw_publish_per_s, end_to_end_per_s, ratio, p50_ms, p99_ms, turn_decode_us, turn_arrow_us, ...}; with --sweep also
"sweep" (rate, p50_ms, p99_ms per rate) and "max_rate_within_goal" (null if none was).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import importlib.metadata
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import duckdb
import msgspec
import nats

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from stacx.actors.run import RunContext  # noqa: E402
from stacx.bus.client import connect  # noqa: E402
from stacx.bus.server import ENV_URL, EmbeddedNats, LocalCluster  # noqa: E402
from stacx.events import Event  # noqa: E402
from stacx.launch.launcher import open_run  # noqa: E402
from stacx.store.schema import to_arrow  # noqa: E402
from stacx.wire import decode_wire, encode  # noqa: E402
from tools.bench.synthetic import episode_events  # noqa: E402


async def wait_for_jetstream(url: str) -> None:
    """A fresh cluster elects its JetStream meta leader within seconds; wait for it."""
    nc = await connect(url)
    for _ in range(240):
        try:
            await nc.jetstream(timeout=1.0).account_info()
            break
        except Exception:
            await asyncio.sleep(0.25)
    await nc.drain()


def make_events(run_id: str, n: int, seed: int = 0) -> list[Event]:
    evs: list[Event] = []
    while len(evs) < n:
        evs += episode_events(run_id, 500, tokens=256, seed=seed + len(evs))
    return evs[:n]


async def raw_rate(url: str, events: list[Event], replicas: int = 1) -> float:
    nc = await nats.connect(url.split(","), pending_size=64 * 1024 * 1024)
    js = nc.jetstream()
    await js.add_stream(name="RAW", subjects=["raw.>"], num_replicas=replicas)
    payloads = [(f"raw.{e.kind}", encode(e)) for e in events]
    t0 = time.perf_counter()
    futures = [await js.publish_async(subj, data) for subj, data in payloads]
    await asyncio.gather(*futures)
    dt = time.perf_counter() - t0
    info = await js.stream_info("RAW")
    assert info.state.messages == len(events), "raw publishes lost"
    await js.delete_stream("RAW")
    await nc.drain()
    return len(events) / dt


@contextlib.asynccontextmanager
async def recorded_run(run_dir: Path) -> AsyncIterator[tuple[RunContext, list[tuple[int, float]]]]:
    """A run opened as ``stacx run`` opens it: its recorder in-process, on the launcher's event
    loop (its commits in a worker thread); yields it and the (stream sequence, unix time) of
    every commit."""
    commits: list[tuple[int, float]] = []
    async with open_run(run_dir, "bench-events", {}) as (run, _):
        assert run.recorder is not None
        run.recorder.on_commit = lambda seq: commits.append((seq, time.time()))
        yield run, commits


async def until_recorded(run: RunContext) -> None:
    assert run.recorder is not None
    await run.recorder.wait_for(await run.last_seq(), timeout=600)


def commit_times(
    run: RunContext, commits: list[tuple[int, float]], events: list[Event]
) -> list[float]:
    """Each event's commit time: that of the commit holding the stream sequence it was recorded
    from (its message's: the publisher batches events of a kind). That is its ack's, unless a
    publish retried across a leader change landed twice: then the first copy is the one
    recorded, and the ack may name the later one, which the recorder skipped."""
    con = duckdb.connect(str(run.run_dir / "trace.duckdb"), read_only=True)
    recorded = dict(con.execute("select event_id, _seq from _events").fetchall())
    con.close()
    assert all(e.event_id in recorded for e in events), "events missing from the log"
    seqs = [c[0] for c in commits]
    return [commits[bisect.bisect_left(seqs, recorded[e.event_id])][1] for e in events]


async def end_to_end(n: int, run_dir: Path) -> float:
    async with recorded_run(run_dir) as (run, commits):
        assert run.publisher is not None
        events = make_events(run.run_id, n)
        pub = run.publisher  # what actors publish through
        t0 = time.time()
        for e in events:
            await pub.submit(e)
        await pub.flush()
        await until_recorded(run)
    return len(events) / (max(commit_times(run, commits, events)) - t0)


async def latency(n: int, run_dir: Path, rate: float) -> tuple[float, float]:
    async with recorded_run(run_dir) as (run, commits):
        assert run.publisher is not None
        events = make_events(run.run_id, n, seed=10**6)
        pub = run.publisher  # what actors publish through
        tick = 0.01
        per_tick = int(rate * tick)
        sent_at: list[float] = []
        t0 = time.perf_counter()
        for i in range(0, len(events), per_tick):
            for e in events[i : i + per_tick]:
                sent_at.append(time.time())
                await pub.submit(e)
            ahead = t0 + (i // per_tick + 1) * tick - time.perf_counter()
            if ahead > 0:
                await asyncio.sleep(ahead)
        await pub.flush()
        await until_recorded(run)
    done = commit_times(run, commits, events)
    lat = sorted((c - t) * 1000 for c, t in zip(done, sent_at, strict=True))
    return lat[len(lat) // 2], lat[int(len(lat) * 0.99)]


def turn_cost(events: list[Event]) -> tuple[float, float]:
    """The recorder's per-TurnGenerated cost in this process, in µs: decoding its wire payload
    (`decode_wire`: token arrays stay packed) and building its Arrow row (`to_arrow`)."""
    turns = [e for e in events if e.kind == "TurnGenerated"]
    payloads = [encode(e) for e in turns]
    t0 = time.perf_counter()
    decoded = [d for p in payloads for d in decode_wire(p)]
    t1 = time.perf_counter()
    to_arrow("TurnGenerated", decoded, list(range(len(decoded))))
    t2 = time.perf_counter()
    return (t1 - t0) / len(turns) * 1e6, (t2 - t1) / len(turns) * 1e6


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=10_000)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument(
        "--sweep",
        default=None,
        help="comma-separated steady rates (events/s), e.g. 3000,5000,8000,10000",
    )
    ap.add_argument("--p99-goal-ms", type=float, default=100.0)
    ap.add_argument(
        "--replicas",
        type=int,
        default=1,
        choices=(1, 3),
        help="3: a 3-server JetStream cluster on loopback, every stream at 3 replicas",
    )
    a = ap.parse_args()
    print(
        f"machine: {platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}, "
        f"duckdb {duckdb.__version__}, msgspec {msgspec.__version__}, nats-py {importlib.metadata.version('nats-py')}"
    )
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        if a.replicas == 3:
            server: EmbeddedNats | LocalCluster = stack.enter_context(
                LocalCluster(Path(tmp) / "nats")
            )
            await wait_for_jetstream(server.url)
        else:
            server = stack.enter_context(EmbeddedNats(Path(tmp) / "nats"))
        os.environ[ENV_URL] = server.url  # the runs reach it as `stacx run` reaches a server
        events = make_events("bench", a.events)
        size = sum(len(encode(e)) for e in events) / len(events)
        print(f"{len(events)} events, mean payload {size:.0f} bytes, stream replicas {a.replicas}")
        decode_us, arrow_us = turn_cost(events)
        print(f"recorder per TurnGenerated: decode {decode_us:.1f} µs, Arrow {arrow_us:.1f} µs")
        raw = await raw_rate(server.url, events, a.replicas)
        print(f"raw JetStream publish: {raw:,.0f} events/s")
        e2e = await end_to_end(a.events, Path(tmp) / "e2e")
        print(f"STACX publish -> committed DuckDB row: {e2e:,.0f} events/s")
        rates = [float(r) for r in a.sweep.split(",")] if a.sweep else [a.rate]
        sweep: list[dict[str, float]] = []
        for i, rate in enumerate(rates):
            p50, p99 = await latency(int(rate * a.seconds), Path(tmp) / f"lat{i}", rate)
            print(
                f"latency at {rate:,.0f} events/s: p50 {p50:.1f} ms, p99 {p99:.1f} ms", flush=True
            )
            sweep.append({"rate": rate, "p50_ms": round(p50, 2), "p99_ms": round(p99, 2)})
    within = [s["rate"] for s in sweep if s["p99_ms"] <= a.p99_goal_ms]
    out: dict[str, object] = {
        "raw_publish_per_s": round(raw),
        "end_to_end_per_s": round(e2e),
        "ratio": round(e2e / raw, 3),
        "p50_ms": sweep[-1]["p50_ms"],
        "p99_ms": sweep[-1]["p99_ms"],
        "events": len(events),
        "mean_payload_bytes": round(size),
        "rate": sweep[-1]["rate"],
        "replicas": a.replicas,
        "turn_decode_us": round(decode_us, 1),
        "turn_arrow_us": round(arrow_us, 1),
    }
    if a.sweep:
        out["sweep"] = sweep
        out["p99_goal_ms"] = a.p99_goal_ms
        out["max_rate_within_goal"] = max(within) if within else None
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())

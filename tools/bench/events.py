"""Event backbone benchmark: raw JetStream publish rate vs STACX end to end, and latency.

In one run, on this machine:
  1. raw: plain nats-py ``publish_async`` of the same pre-encoded payloads into a bare stream,
     every ack awaited;
  2. end to end: STACX's Publisher (message ids, ack checks, backpressure) into the run's
     stream while the recorder (its own process, as under Ray placement) commits every event
     to DuckDB; the clock stops when the last event is committed (queryable);
  3. latency: a steady 10k events/s for a few seconds; for each event, publish -> committed;
     ``--sweep 3000,5000,8000,10000`` measures each of those steady rates instead (a fresh run
     stream and recorder each) and reports the highest one whose p99 is within ``--p99-goal-ms``.
The events are a realistic mix (episode start, 3 turns of TurnGenerated with 256-token
prompt/output arrays and logprobs, tool call/return pairs, finish, reward).
Prints the machine and versions, then one JSON line:
{raw_publish_per_s, end_to_end_per_s, ratio, p50_ms, p99_ms, ...}; with --sweep also
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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import msgspec
import nats

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from stacx.bus.client import Publisher, connect, ensure_stream  # noqa: E402
from stacx.bus.server import EmbeddedNats, LocalCluster  # noqa: E402
from stacx.events import Event, encode  # noqa: E402
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


def start_recorder(url: str, run_id: str, run_dir: Path, until: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "stacx.actors.recorder_process", url, run_id, str(run_dir),
         "--until-events", str(until), "--report"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    return proc


def read_commits(proc: subprocess.Popen[str]) -> list[tuple[int, float]]:
    assert proc.stdout is not None
    out = [(int(a), float(b)) for a, b in (line.split() for line in proc.stdout)]
    proc.wait()
    return out


async def end_to_end(url: str, events: list[Event], run_dir: Path, window: int, replicas: int = 1) -> float:
    run_id = events[0].run_id
    nc = await connect(url)
    js = nc.jetstream()
    await ensure_stream(js, run_id, replicas=replicas)
    proc = start_recorder(url, run_id, run_dir, len(events))
    await asyncio.sleep(1.5)  # let the recorder process connect; it idles until events come
    pub = Publisher(js, run_id, max_pending=window)
    t0 = time.time()
    for e in events:
        await pub.submit(e)
    await pub.flush()
    commits = await asyncio.to_thread(read_commits, proc)
    await nc.drain()
    t_done = commits[-1][1]
    con = duckdb.connect(str(run_dir / "trace.duckdb"), read_only=True)
    n = con.execute("select count(*) from _events").fetchone()[0]
    con.close()
    assert n == len(events), f"recorded {n} of {len(events)}"
    return len(events) / (t_done - t0)


async def latency(url: str, events: list[Event], run_dir: Path, rate: float,
                  replicas: int = 1) -> tuple[float, float]:
    run_id = events[0].run_id
    nc = await connect(url)
    js = nc.jetstream()
    await ensure_stream(js, run_id, replicas=replicas)
    proc = start_recorder(url, run_id, run_dir, len(events))
    await asyncio.sleep(1.5)
    pub = Publisher(js, run_id)
    tick = 0.01
    per_tick = int(rate * tick)
    sent_at: list[float] = []
    t0 = time.perf_counter()
    for i in range(0, len(events), per_tick):
        for e in events[i:i + per_tick]:
            sent_at.append(time.time())
            await pub.submit(e)
        ahead = t0 + (i // per_tick + 1) * tick - time.perf_counter()
        if ahead > 0:
            await asyncio.sleep(ahead)
    await pub.flush()
    commits = await asyncio.to_thread(read_commits, proc)
    await nc.drain()
    # An event's time is that of the commit holding the stream sequence it was recorded from
    # (its message's: the publisher batches events of a kind). That is its ack's, unless a
    # publish retried across a leader change landed twice: then the first copy is the one
    # recorded, and the ack may name the later one, which the recorder skipped.
    con = duckdb.connect(str(run_dir / "trace.duckdb"), read_only=True)
    recorded = dict(con.execute("select event_id, _seq from _events").fetchall())
    con.close()
    seqs = [c[0] for c in commits]
    lat = sorted((commits[bisect.bisect_left(seqs, recorded[e.event_id])][1] - t) * 1000
                 for e, t in zip(events, sent_at, strict=True))
    return lat[len(lat) // 2], lat[int(len(lat) * 0.99)]


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=10_000)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--sweep", default=None,
                    help="comma-separated steady rates (events/s), e.g. 3000,5000,8000,10000")
    ap.add_argument("--p99-goal-ms", type=float, default=100.0)
    ap.add_argument("--window", type=int, default=2048, help="STACX publisher window (in-flight publishes)")
    ap.add_argument("--replicas", type=int, default=1, choices=(1, 3),
                    help="3: a 3-server JetStream cluster on loopback, every stream at 3 replicas")
    a = ap.parse_args()
    print(f"machine: {platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}, "
          f"duckdb {duckdb.__version__}, msgspec {msgspec.__version__}, nats-py {importlib.metadata.version('nats-py')}")
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        if a.replicas == 3:
            server: EmbeddedNats | LocalCluster = stack.enter_context(LocalCluster(Path(tmp) / "nats"))
            await wait_for_jetstream(server.url)
        else:
            server = stack.enter_context(EmbeddedNats(Path(tmp) / "nats"))
        events = make_events("bench", a.events)
        size = sum(len(encode(e)) for e in events) / len(events)
        print(f"{len(events)} events, mean payload {size:.0f} bytes, stream replicas {a.replicas}")
        raw = await raw_rate(server.url, events, a.replicas)
        print(f"raw JetStream publish: {raw:,.0f} events/s")
        e2e = await end_to_end(server.url, events, Path(tmp) / "e2e", a.window, a.replicas)
        print(f"STACX publish -> committed DuckDB row: {e2e:,.0f} events/s")
        rates = [float(r) for r in a.sweep.split(",")] if a.sweep else [a.rate]
        sweep: list[dict[str, float]] = []
        for i, rate in enumerate(rates):
            steady = make_events(f"steady{i}", int(rate * a.seconds), seed=10**6)
            p50, p99 = await latency(server.url, steady, Path(tmp) / f"lat{i}", rate, a.replicas)
            print(f"latency at {rate:,.0f} events/s: p50 {p50:.1f} ms, p99 {p99:.1f} ms", flush=True)
            sweep.append({"rate": rate, "p50_ms": round(p50, 2), "p99_ms": round(p99, 2)})
    within = [s["rate"] for s in sweep if s["p99_ms"] <= a.p99_goal_ms]
    out: dict[str, object] = {
        "raw_publish_per_s": round(raw), "end_to_end_per_s": round(e2e), "ratio": round(e2e / raw, 3),
        "p50_ms": sweep[-1]["p50_ms"], "p99_ms": sweep[-1]["p99_ms"], "events": len(events),
        "mean_payload_bytes": round(size), "rate": sweep[-1]["rate"], "replicas": a.replicas}
    if a.sweep:
        out["sweep"] = sweep
        out["p99_goal_ms"] = a.p99_goal_ms
        out["max_rate_within_goal"] = max(within) if within else None
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())

"""Sandbox benchmark: raw aiodocker vs the STACX pool, and 32 concurrent exec-heavy episodes.

Baseline and STACX are measured in the same run (this machine is noisy; compare ratios):
- raw: aiodocker create+start of a container (the raw start latency), one exec, remove;
  and a bare aiodocker exec of `true` (create + start + read + inspect);
- STACX: warm-pool acquire (a container already started), `DockerSandbox.exec(["true"])`
  (the same round trips plus the `timeout` wrapper, output capture and cgroup counters),
  release (destroy + background replacement). Raw and STACX execs alternate on the same
  container, so the ratio compares like with like; `exec_timeout_overhead_ratio` is the same
  with `timeout=60` (one more process in the container: the `timeout` wrapper);
- 32 episodes at once through one pool: acquire, 8 commands, a file written and read back,
  release.

Goals: warm acquire <= 50 ms p50; exec overhead <= 1.2x raw; 32 concurrent with no failure.
Prints context lines, then ONE JSON line (the last line):
{raw_start_ms_p50, warm_acquire_ms_p50, exec_overhead_ratio, concurrent_32_ok, episodes_per_s, ...}

Usage: .venv/bin/python tools/bench/sandbox.py [--iterations 15] [--episodes 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time

import aiodocker

from stacx.events import Event, SandboxStarted
from stacx.sandbox.docker import DockerSandbox, Limits, owner_labels
from stacx.sandbox.images import BASE_IMAGE, bootstrap_base_image
from stacx.sandbox.pool import SandboxPool

LIMITS = Limits(cpus=1, memory_mb=512, pids=256)


def p50(xs: list[float]) -> float:
    return round(statistics.median(xs), 2)


async def raw_exec(container: aiodocker.containers.DockerContainer, cmd: list[str]) -> int:
    execution = await container.exec(cmd)
    async with execution.start(detach=False) as stream:
        while await stream.read_out() is not None:
            pass
    return int((await execution.inspect())["ExitCode"])


async def bench_raw(docker: aiodocker.Docker, n: int) -> list[float]:
    starts = []
    config = {
        "Image": BASE_IMAGE,
        "Cmd": ["sleep", "infinity"],
        "Labels": {**owner_labels("bench-raw"), "stacx": "1"},
        "HostConfig": {"Init": True, "Memory": 512 << 20, "MemorySwap": 512 << 20},
    }
    for _ in range(n):
        t0 = time.perf_counter()
        container = await docker.containers.create(config)
        await container.start()
        starts.append((time.perf_counter() - t0) * 1000)
        try:
            assert await raw_exec(container, ["true"]) == 0
        finally:
            await container.delete(force=True)
    return starts


async def bench_pool(
    docker: aiodocker.Docker, n: int
) -> tuple[list[float], list[float], list[float], list[float], int]:
    """Warm acquires, and execs paired on the same container: raw aiodocker, then STACX,
    alternating (pairing cancels most of this machine's noise)."""
    acquires: list[float] = []
    raw_execs: list[float] = []
    execs: list[float] = []
    timed_execs: list[float] = []
    started: list[SandboxStarted] = []

    async def emit(event: Event) -> None:
        if isinstance(event, SandboxStarted):
            started.append(event)

    async with SandboxPool(size=2, run_id="bench-pool", docker=docker, emit=emit) as pool:
        for _ in range(n):
            await pool.prewarm(BASE_IMAGE, LIMITS)  # untimed: the pool refills between episodes
            t0 = time.perf_counter()
            sb = await pool.acquire(BASE_IMAGE, LIMITS)
            acquires.append((time.perf_counter() - t0) * 1000)
            await pool.drain()  # untimed: the previous container's removal must not compete
            try:
                for _ in range(5):
                    t1 = time.perf_counter()
                    assert await raw_exec(sb.container, ["true"]) == 0
                    raw_execs.append((time.perf_counter() - t1) * 1000)
                    t1 = time.perf_counter()
                    assert (await sb.exec(["true"])).exit_code == 0
                    execs.append((time.perf_counter() - t1) * 1000)
                    t1 = time.perf_counter()
                    assert (await sb.exec(["true"], timeout=60)).exit_code == 0
                    timed_execs.append((time.perf_counter() - t1) * 1000)
            finally:
                await pool.release(sb)
    return acquires, raw_execs, execs, timed_execs, sum(e.warm for e in started)


async def episode(pool: SandboxPool, i: int) -> bool:
    async with pool.sandbox(BASE_IMAGE, LIMITS, episode_id=f"bench-{i}") as sb:
        ok = True
        for j in range(8):
            cmd = f"echo {i}-{j}" if j % 2 else f"python3 -c 'print({i} * {j})'"
            r = await sb.exec(cmd, timeout=120)
            ok &= r.exit_code == 0 and r.stdout.strip() in (f"{i}-{j}", str(i * j))
        await sb.write_file(f"/app/out-{i}.txt", f"episode {i}")
        ok &= await sb.read_file(f"/app/out-{i}.txt") == f"episode {i}".encode()
        return ok


async def bench_concurrent(docker: aiodocker.Docker, n: int) -> tuple[bool, float, int]:
    async with SandboxPool(size=4, run_id="bench-concurrent", docker=docker) as pool:
        await pool.prewarm(BASE_IMAGE, LIMITS)
        t0 = time.perf_counter()
        results = await asyncio.gather(
            *(episode(pool, i) for i in range(n)), return_exceptions=True
        )
        wall = time.perf_counter() - t0
    failures = [r for r in results if r is not True]
    for f in failures[:3]:
        print(f"episode failure: {f!r}")
    return not failures, n / wall, len(failures)


async def main(iterations: int, episodes: int) -> dict[str, object]:
    bootstrap_base_image()
    async with aiodocker.Docker() as docker:
        version = (await docker.version())["Version"]
        print(f"machine: {platform.node()} {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}")
        print(f"docker engine {version}, aiodocker {aiodocker.__version__}, image {BASE_IMAGE}")
        raw_starts = await bench_raw(docker, iterations)
        acquires, raw_execs, pool_execs, timed_execs, n_warm = await bench_pool(docker, iterations)
        ok, eps, n_failed = await bench_concurrent(docker, episodes)
        # one DockerSandbox started cold, for reference against the raw start
        t0 = time.perf_counter()
        async with await DockerSandbox.create(BASE_IMAGE, LIMITS, docker=docker):
            cold_ms = (time.perf_counter() - t0) * 1000
    return {
        "raw_start_ms_p50": p50(raw_starts),
        "warm_acquire_ms_p50": p50(acquires),
        "stacx_cold_start_ms": round(cold_ms, 1),
        "raw_exec_ms_p50": p50(raw_execs),
        "stacx_exec_ms_p50": p50(pool_execs),
        "exec_overhead_ratio": round(
            statistics.median(pool_execs) / statistics.median(raw_execs), 3
        ),
        "stacx_exec_timeout_ms_p50": p50(timed_execs),
        "exec_timeout_overhead_ratio": round(
            statistics.median(timed_execs) / statistics.median(raw_execs), 3
        ),
        "warm_fraction": round(n_warm / iterations, 2),
        f"concurrent_{episodes}_ok": ok,
        "concurrent_failed": n_failed,
        "episodes_per_s": round(eps, 3),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=15)
    parser.add_argument("--episodes", type=int, default=32)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.iterations, args.episodes))))

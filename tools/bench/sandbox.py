"""Sandbox benchmark: raw aiodocker vs the STACX pool, 32 concurrent exec-heavy episodes, and
the remote backend (sandbox services on NATS) against the local one.

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

- remote: a nats-server on a free loopback port and two `stacx sandbox serve` processes on
  this host's dockerd. `remote_exec_overhead_ratio` is `RemoteSandbox.exec(["true"])` over
  `DockerSandbox.exec(["true"])`, alternating, on two containers of the same image and limits
  (`remote_round_trip_ms_p50`: a `status` request, the protocol's own cost without Docker);
  acquire latency is `RemoteEnvironments.sandbox()` entered cold (warm = 0: the service starts
  a container) and warm (warm = 2: the service's pool had one ready); then `--remote-episodes`
  episodes at once spread over both services (placement by free slots), each: 4 commands, a
  file written and read back.

Goals: warm acquire <= 50 ms p50; exec overhead <= 1.2x raw; 32 concurrent with no failure;
remote exec <= 1.2x local; 64 concurrent remote sandboxes with no failure.
Prints context lines, then ONE JSON line (the last line):
{raw_start_ms_p50, warm_acquire_ms_p50, exec_overhead_ratio, concurrent_32_ok, episodes_per_s,
 remote_exec_overhead_ratio, remote_acquire_cold_ms_p50, remote_acquire_warm_ms_p50,
 remote_concurrent_64_ok, ...}

- hardening (`--hardening`, alone): cold start and exec of the hardened container config
  (stacx.sandbox.privileges) against Docker's defaults, alternating; `--runtime runsc` adds
  gVisor where it is registered with the Docker daemon.

- process (`--process`, alone; no Docker): the process backend's `exec("true")` p50/p99 through
  its spawner (today's path) against the pre-issue-41 path (each command started by
  `asyncio.create_subprocess_exec` with the rlimits in a `preexec_fn`, so Python forks the
  caller, under `unshare` + setup script + `chroot`: `legacy_exec` below), in blocks on one
  sandbox, from this process bare and holding a `--heap-gib` touched heap (and with
  `--device cuda` a CUDA context and a CUDA tensor of that size too), plus sandbox start and
  close latency. Goals (issue 41): new p50 <= 5 ms bare on the 2-core CPU; new heap/bare p50
  within 1.2x.

Usage: .venv/bin/python tools/bench/sandbox.py [--iterations 15] [--episodes 32]
       [--remote-episodes 64] [--no-remote]
       .venv/bin/python tools/bench/sandbox.py --hardening [--iterations 15] [--runtime runsc]
       .venv/bin/python tools/bench/sandbox.py --process [--iterations 200] [--heap-gib 4]
       [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiodocker
from aiodocker.types import JSONValue

from stacx.events import Event, SandboxStarted
from stacx.sandbox.docker import DockerSandbox, Limits, owner_labels
from stacx.sandbox.images import BASE_IMAGE, bootstrap_base_image
from stacx.sandbox.pool import SandboxPool
from stacx.sandbox.process import ProcessSandbox

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
    config: dict[str, JSONValue] = {
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


async def bench_hardening(docker: aiodocker.Docker, n: int, runtime: str) -> dict[str, object]:
    """Cold start (create + start) and `exec true` of a sandbox container with the hardened
    defaults (stacx.sandbox.privileges) against the same config without them (Docker's default
    capabilities, no no-new-privileges), alternating so the machine's noise hits both alike.
    With `runtime` (e.g. runsc) a third column runs the hardened config on that runtime."""
    from stacx.sandbox.docker import container_config

    hardened = container_config(BASE_IMAGE, LIMITS, {**owner_labels("bench-hard"), "stacx": "1"})
    default = json.loads(json.dumps(hardened))
    for key in ("CapDrop", "CapAdd", "SecurityOpt", "Privileged"):
        default["HostConfig"].pop(key, None)
    configs = {"hardened": hardened, "default": default}
    if runtime:
        configs[runtime] = container_config(BASE_IMAGE, LIMITS, hardened["Labels"], runtime)  # type: ignore[arg-type]
    starts: dict[str, list[float]] = {k: [] for k in configs}
    execs: dict[str, list[float]] = {k: [] for k in configs}
    for _ in range(n):
        for name, config in configs.items():
            t0 = time.perf_counter()
            container = await docker.containers.create(config)
            try:
                await container.start()
                starts[name].append((time.perf_counter() - t0) * 1000)
                for _ in range(3):
                    t1 = time.perf_counter()
                    assert await raw_exec(container, ["true"]) == 0
                    execs[name].append((time.perf_counter() - t1) * 1000)
            finally:
                await container.delete(force=True)
    rows: dict[str, object] = {}
    for name in configs:
        rows[f"{name}_start_ms_p50"] = p50(starts[name])
        rows[f"{name}_exec_ms_p50"] = p50(execs[name])
    for name in configs:
        if name != "default":
            rows[f"{name}_start_ratio"] = round(
                statistics.median(starts[name]) / statistics.median(starts["default"]), 3
            )
            rows[f"{name}_exec_ratio"] = round(
                statistics.median(execs[name]) / statistics.median(execs["default"]), 3
            )
    return rows


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


# ---- remote ---------------------------------------------------------------------------------


def bench_task(root: Path) -> Path:
    d = root / "bench-task"
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "instruction.md").write_text("Bench.\n")
    (d / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (d / "environment" / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nWORKDIR /app\n")
    (d / "task.toml").write_text(
        f'version = "1.0"\n[environment]\ncpus = {LIMITS.cpus}\nmemory_mb = {LIMITS.memory_mb}\n'
    )
    return d


def serve(stacx: str, url: str, sid: str, slots: int, root: Path) -> subprocess.Popen[bytes]:
    with open(root / f"{sid}.log", "wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            [
                stacx,
                "sandbox",
                "serve",
                "--url",
                url,
                "--id",
                sid,
                "--slots",
                str(slots),
                "--state-dir",
                str(root / sid),
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )


async def bench_remote(
    docker: aiodocker.Docker, root: Path, iterations: int, episodes: int
) -> dict[str, object]:
    from stacx.bus.client import connect
    from stacx.bus.server import EmbeddedNats
    from stacx.sandbox.remote_hosts import discover

    stacx = str(Path(sys.executable).parent / "stacx")
    task_dir = bench_task(root)
    slots = max(episodes // 2 + 4, 8)
    with EmbeddedNats(root / "nats") as server:
        procs = [serve(stacx, server.url, sid, slots, root) for sid in ("bench-a", "bench-b")]
        try:
            nc = await connect(server.url)
            while len(await discover(nc, wait=0.3)) < 2:
                assert all(p.poll() is None for p in procs), (root / "bench-a.log").read_text()
            await nc.close()
            return await _remote_rows(docker, server.url, task_dir, iterations, episodes)
        finally:
            for p in procs:
                p.terminate()
                p.wait(60)


async def _remote_rows(
    docker: aiodocker.Docker, url: str, task_dir: Path, iterations: int, episodes: int
) -> dict[str, object]:
    from stacx.sandbox.remote import RemoteEnvironments

    started: list[SandboxStarted] = []

    async def emit(event: Event) -> None:
        if isinstance(event, SandboxStarted):
            started.append(event)

    local_execs: list[float] = []
    remote_execs: list[float] = []
    round_trips: list[float] = []  # a `status` request: the protocol's cost without Docker
    cold: list[float] = []
    warm: list[float] = []
    async with RemoteEnvironments(url=url, run_id="bench-cold", token="b", emit=emit) as envs:
        task = envs.task(str(task_dir))
        async with envs.sandbox(task, episode_id="build"):  # untimed: builds the task image
            pass
        for i in range(iterations):
            t0 = time.perf_counter()
            async with envs.sandbox(task, episode_id=f"cold-{i}") as rsb:
                cold.append((time.perf_counter() - t0) * 1000)
                if i == 0:  # exec overhead, on a local container of the same image and limits
                    image = str(rsb.image)  # type: ignore[attr-defined]
                    async with await DockerSandbox.create(image, LIMITS, docker=docker) as lsb:
                        for _ in range(max(iterations, 10) * 2):
                            t1 = time.perf_counter()
                            assert (await lsb.exec(["true"])).exit_code == 0
                            local_execs.append((time.perf_counter() - t1) * 1000)
                            t1 = time.perf_counter()
                            assert (await rsb.exec(["true"])).exit_code == 0
                            remote_execs.append((time.perf_counter() - t1) * 1000)
                            t1 = time.perf_counter()
                            assert await rsb.status()  # type: ignore[attr-defined]
                            round_trips.append((time.perf_counter() - t1) * 1000)
    async with RemoteEnvironments(
        url=url, run_id="bench-warm", token="b", emit=emit, warm=2
    ) as envs:
        task = envs.task(str(task_dir))
        for i in range(iterations + 1):
            await asyncio.sleep(1.5)  # untimed: the services' pools refill between episodes
            t0 = time.perf_counter()
            async with envs.sandbox(task, episode_id=f"warm-{i}"):
                ms = (time.perf_counter() - t0) * 1000
            if started[-1].warm:
                warm.append(ms)
    n_warm_events = sum(e.warm for e in started if e.episode_id and "warm-" in e.episode_id)

    async def remote_episode(envs: RemoteEnvironments, task: object, i: int) -> str:
        async with envs.sandbox(task, episode_id=f"conc-{i}") as sb:  # type: ignore[arg-type]
            for j in range(4):
                r = await sb.exec(f"echo {i}-{j}", timeout=120)
                assert r.exit_code == 0 and r.stdout == f"{i}-{j}\n", r
            await sb.write_file(f"/app/out-{i}.txt", f"episode {i}")
            assert await sb.read_file(f"/app/out-{i}.txt") == f"episode {i}".encode()
            return str(sb.service_id)  # type: ignore[attr-defined]

    async with RemoteEnvironments(
        url=url, run_id="bench-conc", token="b", place_wait_s=300
    ) as envs:
        task = envs.task(str(task_dir))
        t0 = time.perf_counter()
        results = await asyncio.gather(
            *(remote_episode(envs, task, i) for i in range(episodes)), return_exceptions=True
        )
        wall = time.perf_counter() - t0
    failures = [r for r in results if not isinstance(r, str)]
    for f in failures[:3]:
        print(f"remote episode failure: {f!r}")
    per_host = {h: sum(r == h for r in results) for h in ("bench-a", "bench-b")}
    print(f"remote: {episodes} concurrent episodes per service: {per_host}")
    return {
        "local_exec_ms_p50": p50(local_execs),
        "remote_exec_ms_p50": p50(remote_execs),
        "remote_round_trip_ms_p50": p50(round_trips),
        "remote_exec_overhead_ratio": round(
            statistics.median(remote_execs) / statistics.median(local_execs), 3
        ),
        "remote_acquire_cold_ms_p50": p50(cold),
        "remote_acquire_warm_ms_p50": p50(warm) if warm else None,
        "remote_warm_fraction": round(n_warm_events / (iterations + 1), 2),
        f"remote_concurrent_{episodes}_ok": not failures,
        "remote_concurrent_failed": len(failures),
        "remote_concurrent_per_service": per_host,
        "remote_episodes_per_s": round(episodes / wall, 3),
    }


async def main(
    iterations: int, episodes: int, remote_episodes: int, remote: bool
) -> dict[str, object]:
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
        remote_rows: dict[str, object] = {}
        if remote:
            with tempfile.TemporaryDirectory(prefix="stacx-bench-") as tmp:
                remote_rows = await bench_remote(docker, Path(tmp), iterations, remote_episodes)
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
        **remote_rows,
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


# The pre-issue-41 exec path, kept here as the baseline: per command, `unshare` runs this script,
# which binds the host's top level into the root and chroots as the command's user.
LEGACY_SETUP = r"""
set -e
R=$1 CWD=$2 SPEC=$3 LO=$4; shift 4
while [ "$1" != -- ]; do mount --rbind "/$1" "$R/$1"; shift; done; shift
if [ "$LO" = 1 ]; then ip link set lo up 2>/dev/null || true; fi
exec chroot --userspec="$SPEC" "$R" /bin/sh -c 'cd "$0" && exec "$@"' "$CWD" "$@"
"""


async def legacy_exec(sb: ProcessSandbox, cmd: str) -> int:
    """`exec(cmd)` as the process backend ran it before issue 41 (the rlimits in a preexec_fn:
    Python forks this whole process), without the output caps and flags (no cost here)."""
    import resource

    from stacx.sandbox.containment import rlimits

    assert sb.root is not None
    limits = rlimits(sb.limits, 10.0)
    ids = sb._ids(None)
    net = not sb.limits.allow_internet and sb._probe.net
    argv = [*sb._probe.unshare, *(["--net"] if net else []), "--"]
    if sb.isolation == "namespaces":
        spec = "0:0" if ids is None else f"{ids[0]}:{ids[1]}"
        argv += ["/bin/sh", "-c", LEGACY_SETUP, "setup", str(sb.root), sb.workdir, spec]
        argv += ["1" if net else "0", *sb._binds, "--"]
    elif not net:
        argv = []

    def preexec() -> None:
        for res, soft, hard in limits:
            resource.setrlimit(res, (soft, hard))

    proc = await asyncio.create_subprocess_exec(
        *argv,
        "bash",
        "-c",
        cmd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        preexec_fn=preexec,
    )
    await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode


def hold_heap(gib: float, device: str) -> list[object]:
    """A heap of `gib` GiB, every page touched (and on CUDA: the context and a CUDA tensor of
    the same size), held until the list is dropped."""
    n = int(gib * (1 << 30))
    heap = bytearray(n)
    heap[::4096] = b"\x01" * len(range(0, n, 4096))  # touched: resident and page-mapped
    held: list[object] = [heap]
    if device == "cuda":
        import torch

        held.append(torch.ones(n, dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()
    return held


def percentile(xs: list[float], q: float) -> float:
    return round(sorted(xs)[min(len(xs) - 1, int(q * len(xs)))], 2)


async def bench_process(iterations: int, heap_gib: float, device: str) -> dict[str, object]:
    print(
        f"machine: {platform.node()} {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}; "
        f"python {platform.python_version()}; heap {heap_gib} GiB on {device}"
    )
    starts, closes = [], []
    for _ in range(10):
        t0 = time.perf_counter()
        sb = await ProcessSandbox.create(LIMITS, run_id="bench")
        starts.append((time.perf_counter() - t0) * 1000)
        assert (await sb.exec("true")).exit_code == 0
        t1 = time.perf_counter()
        await sb.close()
        closes.append((time.perf_counter() - t1) * 1000)
    rows: dict[str, object] = {"isolation": sb.isolation, "root": sb.uid is not None}
    # the machine's floor: `bash -c true` started by vfork from this process, no sandbox
    floor = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        subprocess.run(["bash", "-c", "true"], check=True)  # noqa: ASYNC221  (a floor: nothing else runs)
        floor.append((time.perf_counter() - t0) * 1000)
    rows["floor_bash_true_ms_p50"] = percentile(floor, 0.5)
    times: dict[str, list[float]] = {}
    async with ProcessSandbox(LIMITS, run_id="bench") as sb:
        # in blocks, not alternating (an old exec's child tears down its copy of the heap's page
        # tables on the other core while the next command would run), in the order new bare,
        # new heap, old heap, old bare: the two new blocks side by side, before any old fork
        held: list[object] = []
        for key in ("new_bare", "new_heap", "old_heap", "old_bare"):
            if key == "new_heap":
                held = hold_heap(heap_gib, device)
                await asyncio.sleep(1.0)  # the allocation's aftermath (page zeroing) settles
            elif key == "old_bare":
                held.clear()
            xs = times[key] = []
            for _ in range(iterations):
                t0 = time.perf_counter()
                if key.startswith("new"):
                    assert (await sb.exec("true")).exit_code == 0
                else:
                    assert await legacy_exec(sb, "true") == 0
                xs.append((time.perf_counter() - t0) * 1000)
    for key, xs in times.items():
        rows[f"exec_true_ms_p50_{key}"] = percentile(xs, 0.5)
        rows[f"exec_true_ms_p99_{key}"] = percentile(xs, 0.99)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        **rows,
        "heap_over_bare_new": round(med["new_heap"] / med["new_bare"], 3),
        "heap_over_bare_old": round(med["old_heap"] / med["old_bare"], 3),
        "new_over_old_bare": round(med["new_bare"] / med["old_bare"], 3),
        "new_over_old_heap": round(med["new_heap"] / med["old_heap"], 3),
        "start_ms_p50": p50(starts),
        "close_ms_p50": p50(closes),
        "goal_p50_le_5ms": med["new_bare"] <= 5.0,
        "goal_heap_within_1_2x": med["new_heap"] / med["new_bare"] <= 1.2,
        "heap_gib": heap_gib,
        "device": device,
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


async def hardening_only(iterations: int, runtime: str) -> dict[str, object]:
    bootstrap_base_image()
    async with aiodocker.Docker() as docker:
        print(f"machine: {platform.node()} {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}")
        return await bench_hardening(docker, iterations, runtime)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--hardening",
        action="store_true",
        help="Only the hardened-vs-default comparison (cold start, exec).",
    )
    parser.add_argument(
        "--runtime", default="", help="With --hardening: also this OCI runtime (runsc)."
    )
    parser.add_argument("--iterations", type=int, default=15)
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--remote-episodes", type=int, default=64)
    parser.add_argument("--no-remote", action="store_true", help="Skip the remote rows.")
    parser.add_argument(
        "--process",
        action="store_true",
        help="Only the process backend's exec, bare vs holding a heap, new vs old.",
    )
    parser.add_argument("--heap-gib", type=float, default=4.0, help="With --process.")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="With --process.")
    args = parser.parse_args()
    if args.process:
        iterations = args.iterations if "--iterations" in sys.argv else 200
        print(json.dumps(asyncio.run(bench_process(iterations, args.heap_gib, args.device))))
        sys.exit(0)
    if args.hardening:
        print(json.dumps(asyncio.run(hardening_only(args.iterations, args.runtime))))
        sys.exit(0)
    result = asyncio.run(
        main(args.iterations, args.episodes, args.remote_episodes, not args.no_remote)
    )
    print(json.dumps(result))

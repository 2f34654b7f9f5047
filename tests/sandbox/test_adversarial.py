"""Adversarial commands, one property each, against every backend (real containers, marked
`docker`; process sandboxes, unmarked): each is contained, is reported as what it is, and
leaves the host, the sandbox and its neighbours usable."""

from __future__ import annotations

import asyncio
import tracemalloc

import pytest

from stacx.ports import Sandbox
from stacx.sandbox.process import ProcessSandbox, isolation
from tests.sandbox.backends import TIGHT, backend, live_processes, neighbour, sandbox

__all__ = ["backend", "neighbour", "sandbox"]  # the parametrized fixtures

INTERFACES = "python3 -c 'import socket; print(*sorted(n for _, n in socket.if_nameindex()))'"


async def assert_usable(*sandboxes: Sandbox) -> None:
    for sb in sandboxes:
        r = await sb.exec("echo alive", timeout=60)
        assert r.stdout == "alive\n", r
    # the host still forks processes
    host = await asyncio.create_subprocess_exec("true")
    assert await host.wait() == 0


async def test_fork_bomb_hits_pids_limit_and_is_killed(
    sandbox: Sandbox, neighbour: Sandbox
) -> None:
    r = await sandbox.exec(":(){ :|:& };:", timeout=20)
    assert r.pids_limited and not r.timed_out
    # its background children were killed with it: the sandbox has pids to spare again
    if isinstance(sandbox, ProcessSandbox):
        assert await live_processes(sandbox) == []
    else:
        ps = await sandbox.exec("ps -e --no-headers | wc -l", timeout=60)
        assert int(ps.stdout) < 10, ps
    await assert_usable(sandbox, neighbour)


async def test_memory_beyond_limit_is_oom_killed(sandbox: Sandbox, neighbour: Sandbox) -> None:
    r = await sandbox.exec("python3 -c 'b = bytearray(600 * 2**20); print(len(b))'", timeout=60)
    assert r.oom_killed and r.stdout == ""
    # Docker: the kernel's OOM killer (SIGKILL); process: RLIMIT_AS, a MemoryError (exit 1)
    assert r.exit_code == (1 if isinstance(sandbox, ProcessSandbox) else 137), r
    await assert_usable(sandbox, neighbour)


async def test_no_network_when_internet_is_not_allowed(sandbox: Sandbox) -> None:
    if isinstance(sandbox, ProcessSandbox) and not isolation().net:
        pytest.skip("no network namespace on this machine (the module docstring says so)")
    r = await sandbox.exec(
        f"{INTERFACES}; python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), 3)'",
        timeout=30,
    )
    assert r.stdout.split() == ["lo"]
    assert r.exit_code != 0 and "Network is unreachable" in r.stderr


async def test_network_interface_when_internet_is_allowed(neighbour: Sandbox) -> None:
    # the control for the test above: the same probe sees an interface besides lo
    r = await neighbour.exec(INTERFACES)
    assert set(r.stdout.split()) - {"lo"}, r


async def test_infinite_loop_past_timeout_is_killed(sandbox: Sandbox) -> None:
    r = await sandbox.exec("while :; do :; done", timeout=1)
    assert r.timed_out and r.exit_code is None
    if isinstance(sandbox, ProcessSandbox):
        assert await live_processes(sandbox) == []
    else:
        ps = await sandbox.exec(["ps", "-eo", "args", "--no-headers"])
        assert not [line for line in ps.stdout.splitlines() if "while :" in line], ps.stdout
    await assert_usable(sandbox)


async def test_trapped_term_is_followed_by_kill(sandbox: Sandbox) -> None:
    r = await sandbox.exec("trap '' TERM; while :; do :; done", timeout=1)
    assert r.timed_out
    await assert_usable(sandbox)


async def test_gigabyte_of_stdout_is_capped_in_memory(sandbox: Sandbox) -> None:
    tracemalloc.start()
    try:
        r = await sandbox.exec("head -c 1000000000 /dev/zero | tr '\\0' x")  # no timeout
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.truncated
    assert len(r.stdout) <= sandbox.output_limit + 200  # type: ignore[attr-defined]
    assert "bytes truncated by stacx" in r.stdout
    assert "output flood" in r.stderr
    assert peak < 64 << 20, f"peak traced allocation {peak} bytes"
    await assert_usable(sandbox)


async def test_process_cpu_seconds_limit_stops_a_loop_without_timeout() -> None:
    async with await ProcessSandbox.create(TIGHT, cpu_seconds=1) as sb:
        r = await sb.exec("while :; do :; done")  # no wall-clock timeout: RLIMIT_CPU ends it
        assert r.timed_out and r.exit_code is None and "SIGXCPU" in r.stderr
        await assert_usable(sb)


async def test_process_background_child_does_not_hold_exec_open() -> None:
    async with await ProcessSandbox.create(TIGHT) as sb:
        r = await sb.exec("sleep 600 & echo started", timeout=30)
        assert (r.exit_code, r.stdout, r.timed_out) == (0, "started\n", False)
        assert r.duration_ms < 10_000

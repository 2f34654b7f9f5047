"""Adversarial commands, one property each, against real containers: each is contained, is
reported as what it is, and leaves the host, the sandbox and its neighbours usable."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator

import aiodocker
import pytest

from stacx.sandbox.docker import DockerSandbox, Limits

pytestmark = pytest.mark.docker


@pytest.fixture
async def neighbour(base_image: str, docker: aiodocker.Docker) -> AsyncIterator[DockerSandbox]:
    sb = await DockerSandbox.create(base_image, Limits(memory_mb=128), docker=docker)
    try:
        yield sb
    finally:
        await sb.close()


async def assert_usable(*sandboxes: DockerSandbox) -> None:
    for sb in sandboxes:
        r = await sb.exec("echo alive", timeout=60)
        assert r.stdout == "alive\n", r
    # the host still forks processes
    host = await asyncio.create_subprocess_exec("true")
    assert await host.wait() == 0


async def test_fork_bomb_hits_pids_limit_and_is_killed(
    sandbox: DockerSandbox, neighbour: DockerSandbox
) -> None:
    r = await sandbox.exec(":(){ :|:& };:", timeout=20)
    assert r.pids_limited
    # its background children were killed with it: the sandbox has pids to spare again
    ps = await sandbox.exec("ps -e --no-headers | wc -l", timeout=60)
    assert int(ps.stdout) < 10, ps
    await assert_usable(sandbox, neighbour)


async def test_memory_beyond_limit_is_oom_killed(
    sandbox: DockerSandbox, neighbour: DockerSandbox
) -> None:
    r = await sandbox.exec("python3 -c 'b = bytearray(600 * 2**20); print(len(b))'", timeout=60)
    assert r.oom_killed and r.exit_code == 137 and r.stdout == ""
    await assert_usable(sandbox, neighbour)


async def test_no_network_when_internet_is_not_allowed(sandbox: DockerSandbox) -> None:
    r = await sandbox.exec(
        "ls /sys/class/net; python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), 3)'",
        timeout=30,
    )
    assert r.stdout.split() == ["lo"]
    assert r.exit_code != 0 and "Network is unreachable" in r.stderr


async def test_network_interface_when_internet_is_allowed(neighbour: DockerSandbox) -> None:
    # the control for the test above: the same probe sees an interface besides lo
    r = await neighbour.exec("ls /sys/class/net")
    assert "eth0" in r.stdout.split()


async def test_infinite_loop_past_timeout_is_killed(sandbox: DockerSandbox) -> None:
    r = await sandbox.exec("while :; do :; done", timeout=1)
    assert r.timed_out and r.exit_code is None
    ps = await sandbox.exec(["ps", "-eo", "args", "--no-headers"])
    assert not [line for line in ps.stdout.splitlines() if "while :" in line], ps.stdout
    await assert_usable(sandbox)


async def test_trapped_term_is_followed_by_kill(sandbox: DockerSandbox) -> None:
    r = await sandbox.exec("trap '' TERM; while :; do :; done", timeout=1)
    assert r.timed_out
    await assert_usable(sandbox)


async def test_gigabyte_of_stdout_is_capped_in_memory(sandbox: DockerSandbox) -> None:
    tracemalloc.start()
    try:
        r = await sandbox.exec("head -c 1000000000 /dev/zero | tr '\\0' x")  # no timeout
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.truncated
    assert len(r.stdout) <= sandbox.output_limit + 200
    assert "bytes truncated by stacx" in r.stdout
    assert "output flood" in r.stderr
    assert peak < 64 << 20, f"peak traced allocation {peak} bytes"
    await assert_usable(sandbox)

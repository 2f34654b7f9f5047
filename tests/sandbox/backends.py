"""The Sandbox port's backends as one parametrized fixture: each test that takes `sandbox`
(or `neighbour`) runs against Docker (marked `docker`) and the process backend (unmarked: it
needs no Docker). Import the fixtures into a test module to use them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from stacx.ports import Limits, Sandbox
from stacx.sandbox.containment import live_processes as _live_processes
from stacx.sandbox.process import ProcessSandbox

TIGHT = Limits(cpus=1, memory_mb=256, pids=128, allow_internet=False)
ROOMY = Limits(memory_mb=128)  # and the internet allowed


@pytest.fixture(params=[pytest.param("docker", marks=pytest.mark.docker), "process"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def _open(request: pytest.FixtureRequest, backend: str, limits: Limits) -> Sandbox:
    if backend == "docker":
        from stacx.sandbox.docker import DockerSandbox

        # its own client (closed with it): `docker` is an async fixture, which an async
        # fixture cannot request by name
        return await DockerSandbox.create(
            request.getfixturevalue("base_image"), limits, run_id="test"
        )
    return await ProcessSandbox.create(limits, run_id="test")


@pytest.fixture
async def sandbox(request: pytest.FixtureRequest, backend: str) -> AsyncIterator[Sandbox]:
    """A sandbox with tight limits: 1 cpu, 256 MB, 128 pids, no network."""
    sb = await _open(request, backend, TIGHT)
    try:
        yield sb
    finally:
        await sb.close()


@pytest.fixture
async def neighbour(request: pytest.FixtureRequest, backend: str) -> AsyncIterator[Sandbox]:
    """A second sandbox of the same backend, with the internet allowed."""
    sb = await _open(request, backend, ROOMY)
    try:
        yield sb
    finally:
        await sb.close()


async def live_processes(sb: ProcessSandbox) -> list[int]:
    """The live (not zombie) processes of a process sandbox's own uid, seen from the host."""
    if sb.uid is None:
        pytest.skip("not root: the process backend has no uid of its own to count")
    for _ in range(50):  # SIGKILLed processes take a moment to be reaped
        if not _live_processes(sb.uid):
            break
        await asyncio.sleep(0.05)
    return _live_processes(sb.uid)

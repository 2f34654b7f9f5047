"""The warm pool: warm hand-out, destroy-on-release, replacement, events, cleanup."""

from __future__ import annotations

import aiodocker
import pytest

from stacx.events import SandboxStarted, SandboxStopped
from stacx.sandbox.docker import Limits
from stacx.sandbox.pool import SandboxPool

from .conftest import Recorder

pytestmark = pytest.mark.docker

LIMITS = Limits(memory_mb=128, pids=64)


async def test_prewarmed_acquire_is_warm_and_release_replaces(
    base_image: str, docker: aiodocker.Docker, emitted: Recorder
) -> None:
    async with SandboxPool(size=1, run_id="r1", emit=emitted, docker=docker) as pool:
        await pool.prewarm(base_image, LIMITS)
        assert pool.ready_count(base_image, LIMITS) == 1
        sb = await pool.acquire(base_image, LIMITS, episode_id="ep1")
        assert (await sb.exec("echo hi")).stdout == "hi\n"
        await pool.release(sb)
        await pool.drain()  # removal and replacement run in the background
        assert pool.ready_count(base_image, LIMITS) == 1
        with pytest.raises(aiodocker.DockerError):
            await docker.containers.get(sb.id)  # the used container is gone, not pooled
    started = emitted.of(SandboxStarted)
    stopped = emitted.of(SandboxStopped)
    assert [(e.warm, e.episode_id, e.run_id) for e in started] == [(True, "ep1", "r1")]  # type: ignore[attr-defined]
    assert [(e.sandbox_id, e.episode_id) for e in stopped] == [(sb.id, "ep1")]  # type: ignore[attr-defined]


async def test_a_container_is_never_reused_dirty(base_image: str, docker: aiodocker.Docker) -> None:
    async with SandboxPool(size=1, docker=docker) as pool:
        async with pool.sandbox(base_image, LIMITS) as first:
            await first.write_file("/app/secret.txt", "from episode 1")
        async with pool.sandbox(base_image, LIMITS) as second:
            assert second.id != first.id
            with pytest.raises(FileNotFoundError):
                await second.read_file("/app/secret.txt")


async def test_empty_pool_starts_cold(
    base_image: str, docker: aiodocker.Docker, emitted: Recorder
) -> None:
    async with SandboxPool(size=0, emit=emitted, docker=docker) as pool:
        async with pool.sandbox(base_image, LIMITS):
            pass
        assert pool.ready_count(base_image, LIMITS) == 0
    assert [e.warm for e in emitted.of(SandboxStarted)] == [False]  # type: ignore[attr-defined]


async def test_close_removes_every_container_it_started(
    base_image: str, docker: aiodocker.Docker
) -> None:
    pool = SandboxPool(size=2, run_id="pool-close-test", docker=docker)
    await pool.prewarm(base_image, LIMITS)
    held = await pool.acquire(base_image, LIMITS)
    await pool.close()
    left = await docker.containers.list(
        all=True, filters={"label": ["stacx.run_id=pool-close-test"]}
    )
    assert left == [] and held.id

"""A warm pool of sandboxes per (image, limits), hiding start latency. A container is never reused
after an episode: `release` destroys it and starts a replacement. A failed background start is
retried with backoff and surfaces at the next cold `acquire`. Not thread-safe: one per event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Coroutine

import aiodocker
import msgspec

from stacx.errors import SandboxError
from stacx.events import Emit
from stacx.sandbox.docker import DockerSandbox, Limits
from stacx.sandbox.lifecycle import Emitting

log = logging.getLogger(__name__)
PoolKey = tuple[str, bytes]  # (image, encoded Limits): Limits holds a dict, so is unhashable


class SandboxPool(Emitting):
    """Warm sandboxes; `size` ready containers per key once that key has been asked for."""

    def __init__(
        self,
        *,
        size: int = 2,
        run_id: str = "",
        emit: Emit | None = None,
        docker: aiodocker.Docker | None = None,
        max_starting: int = 4,
        runtime: str = "",
    ) -> None:
        if size < 0:
            raise ValueError(f"pool size must be >= 0, got {size}")
        self.size = size
        self.runtime = runtime  # the OCI runtime of its containers (stacx.sandbox.docker)
        self.run_id = run_id
        self.emit = emit
        self._docker = docker
        self._owns_docker = docker is None
        self._ready: dict[PoolKey, deque[DockerSandbox]] = {}
        self._limits: dict[PoolKey, Limits] = {}
        self._starting: dict[PoolKey, set[asyncio.Task[None]]] = {}
        self._start_slots = asyncio.Semaphore(max_starting)
        self._background: set[asyncio.Task[None]] = set()
        self._active: set[DockerSandbox] = set()
        self._fresh: set[DockerSandbox] = set()  # acquired with fresh=True: never pooled
        self._closed = False
        self._closing = asyncio.Event()

    @property
    def docker(self) -> aiodocker.Docker:
        if self._docker is None:
            self._docker = aiodocker.Docker()
        return self._docker

    async def __aenter__(self) -> SandboxPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _new(self, image: str, limits: Limits, episode_id: str | None) -> DockerSandbox:
        return DockerSandbox(
            self.docker,
            image,
            limits,
            run_id=self.run_id,
            episode_id=episode_id,
            runtime=self.runtime,
        )

    def _spawn(self, coro: Coroutine[object, object, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _key(self, image: str, limits: Limits | None) -> PoolKey:
        limits = limits or Limits()
        key = image, msgspec.json.encode(limits)
        self._limits.setdefault(key, limits)
        return key

    def _refill(self, key: PoolKey) -> None:
        ready = self._ready.setdefault(key, deque())
        starting = self._starting.setdefault(key, set())
        while not self._closed and len(ready) + len(starting) < self.size:
            task = self._spawn(self._start_warm(key))
            starting.add(task)
            task.add_done_callback(starting.discard)

    async def _start_warm(self, key: PoolKey, backoff: float = 0.5) -> None:
        while not self._closed:
            sandbox = self._new(key[0], self._limits[key], None)
            try:
                async with self._start_slots:
                    await sandbox.start()
            except SandboxError as exc:
                log.warning("warm start of %s failed (retry in %.1fs): %s", key[0], backoff, exc)
                with contextlib.suppress(TimeoutError):  # close() cuts the backoff short
                    await asyncio.wait_for(self._closing.wait(), backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            if self._closed:
                await sandbox.close()
            else:
                self._ready.setdefault(key, deque()).append(sandbox)
            return

    async def prewarm(self, image: str, limits: Limits | None = None) -> None:
        """Fill the pool for this key and wait until `size` containers are ready."""
        key = self._key(image, limits)
        self._refill(key)
        await asyncio.gather(*self._starting.get(key, ()))

    async def drain(self) -> None:
        """Wait until background work (removals of released containers, refills) is done."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    def ready_count(self, image: str, limits: Limits | None = None) -> int:
        return len(self._ready.get(self._key(image, limits), ()))

    async def acquire(
        self,
        image: str,
        limits: Limits | None = None,
        *,
        episode_id: str | None = None,
        fresh: bool = False,
    ) -> DockerSandbox:
        """A started sandbox for image and limits (`fresh`: cold, never pooled); SandboxError."""
        if self._closed:
            raise SandboxError("the sandbox pool is closed")
        t0 = time.perf_counter()
        key = None if fresh else self._key(image, limits)  # a fresh one has no key: never pooled
        ready = self._ready.get(key) if key is not None else None
        warm = bool(ready)
        if ready:
            sandbox = ready.popleft()
            sandbox.episode_id = episode_id
        else:
            own = self._limits[key] if key is not None else limits or Limits()
            sandbox = self._new(image, own, episode_id)
            await sandbox.start()
        self._active.add(sandbox)
        if key is None:
            self._fresh.add(sandbox)
        else:
            self._refill(key)
        wait_ms = (time.perf_counter() - t0) * 1000
        await self.started(sandbox.id, image, episode_id, wait_ms, warm=warm)
        return sandbox

    async def release(self, sandbox: DockerSandbox, *, reason: str = "released") -> None:
        """Destroy the sandbox (in the background) and keep its key's pool full."""
        self._active.discard(sandbox)
        fresh = sandbox in self._fresh
        self._fresh.discard(sandbox)
        if fresh:
            await sandbox.close()
        else:
            self._spawn(sandbox.close())
        await self.stopped(sandbox.id, sandbox.episode_id, reason)
        if not fresh:
            self._refill(self._key(sandbox.image, sandbox.limits))

    @contextlib.asynccontextmanager
    async def sandbox(
        self, image: str, limits: Limits | None = None, *, episode_id: str | None = None
    ) -> AsyncIterator[DockerSandbox]:
        """`async with pool.sandbox(image, limits) as sb:` acquire, then release on exit."""
        sandbox = await self.acquire(image, limits, episode_id=episode_id)
        try:
            yield sandbox
        finally:
            await self.release(sandbox)

    async def close(self) -> None:
        """Stop refilling, remove every container this pool started, close an owned client."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        # Let in-flight starts finish (they close what they started), then remove the rest.
        await self.drain()
        leftovers = [sb for q in self._ready.values() for sb in q] + list(self._active)
        self._ready.clear()
        self._active.clear()
        await asyncio.gather(*(sb.close() for sb in leftovers), return_exceptions=True)
        if self._owns_docker and self._docker is not None:
            await self._docker.close()

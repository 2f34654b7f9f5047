"""The rollout manager's `Environments` over the environment engine: task images, the warm
pool, the verifier (all from stacx.sandbox), with their failures mapped to FailureKind.

- image build failure (or a base image with no local alias) -> IMAGE_BUILD;
- container start failure -> START;
- verifier timeout / no reward / OOM / transport -> the verifier's own kind.

The pool's SandboxStarted/SandboxStopped events go through `emit`. Sandboxes are never
reused after an episode (the pool destroys them on release).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Self

import aiodocker

from stacx.errors import SandboxError, TaskError
from stacx.events import Emit, FailureKind
from stacx.rollout.episode import InfraFailure, Verdict
from stacx.sandbox.build import build_task_image
from stacx.sandbox.check import task_limits
from stacx.sandbox.pool import SandboxPool
from stacx.sandbox.protocol import Sandbox
from stacx.sandbox.tasks import Task
from stacx.sandbox.verifier import VerifierFailure, run_verifier


class DockerEnvironments:
    """Docker-backed `Environments`; an async context manager owning a client and a pool."""

    def __init__(self, *, run_id: str, emit: Emit | None = None, warm: int = 0) -> None:
        self.run_id = run_id
        self.emit = emit
        self.warm = warm  # ready containers kept per (image, limits); 0: start on demand
        self._docker: aiodocker.Docker | None = None
        self._pool: SandboxPool | None = None

    async def __aenter__(self) -> Self:
        self._docker = aiodocker.Docker()
        self._pool = SandboxPool(
            size=self.warm, run_id=self.run_id, emit=self.emit, docker=self._docker
        )
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._pool is not None:
            await self._pool.close()
        if self._docker is not None:
            await self._docker.close()

    @contextlib.asynccontextmanager
    async def sandbox(self, task: Task, *, episode_id: str) -> AsyncIterator[Sandbox]:
        assert self._pool is not None and self._docker is not None, "use `async with`"
        try:
            image = await build_task_image(task, self._docker)
            limits = task_limits(task)
        except TaskError as exc:
            raise InfraFailure(FailureKind.IMAGE_BUILD, str(exc)) from exc
        try:
            sandbox = await self._pool.acquire(image, limits, episode_id=episode_id)
        except SandboxError as exc:
            raise InfraFailure(FailureKind.START, str(exc)) from exc
        try:
            yield sandbox
        finally:
            await self._pool.release(sandbox)

    async def verify(self, sandbox: Sandbox, task: Task, *, episode_id: str) -> Verdict:
        outcome = await run_verifier(sandbox, task)
        if isinstance(outcome, VerifierFailure):
            detail = f"{outcome.reason}\n{outcome.output}" if outcome.output else outcome.reason
            raise InfraFailure(outcome.kind, detail)
        metrics = {k: v for k, v in outcome.metrics.items() if k != "reward"}
        return Verdict(reward=outcome.reward, metrics=metrics, verifier_ms=outcome.duration_ms)

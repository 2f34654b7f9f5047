"""The `Environments` port (stacx.ports) over Docker: task images, the warm pool, the verifier,
with their failures mapped to FailureKind (raised as InfraFailure). stacx.launch hands it to
the rollout manager.

- image build failure (or a base image with no local alias) -> IMAGE_BUILD;
- container start failure, or a task healthcheck ([environment.healthcheck]) that does not
  pass before the agent starts -> START;
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
from stacx.ports import InfraFailure, Sandbox, Task, Verdict
from stacx.sandbox.aliases import AliasMap
from stacx.sandbox.build import build_task_image
from stacx.sandbox.health import wait_healthy
from stacx.sandbox.pool import SandboxPool
from stacx.sandbox.tasks import load_task, task_limits
from stacx.sandbox.verifier import run_verifier, verdict


class DockerEnvironments:
    """Docker-backed `Environments`; an async context manager owning a client and a pool."""

    def __init__(
        self,
        *,
        run_id: str,
        emit: Emit | None = None,
        warm: int = 0,
        aliases: AliasMap | None = None,
    ) -> None:
        self.run_id = run_id
        self.emit = emit
        self.warm = warm  # ready containers kept per (image, limits); 0: start on demand
        self.aliases = aliases  # base-image aliases for builds; None: $STACX_IMAGE_ALIASES
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

    def task(self, path: str) -> Task:
        return load_task(path)

    @contextlib.asynccontextmanager
    async def sandbox(self, task: Task, *, episode_id: str) -> AsyncIterator[Sandbox]:
        assert self._pool is not None and self._docker is not None, "use `async with`"
        try:
            image = await build_task_image(task, self._docker, self.aliases)
            limits = task_limits(task)
        except (TaskError, aiodocker.DockerError) as exc:
            raise InfraFailure(FailureKind.IMAGE_BUILD, str(exc)) from exc
        try:
            sandbox = await self._pool.acquire(image, limits, episode_id=episode_id)
        except (SandboxError, aiodocker.DockerError) as exc:
            raise InfraFailure(FailureKind.START, str(exc)) from exc
        healthcheck = task.config.environment.healthcheck
        if healthcheck is not None:  # the agent starts only once the task's services are up
            try:
                await wait_healthy(sandbox, healthcheck)
            except (SandboxError, aiodocker.DockerError) as exc:
                await self._pool.release(sandbox, reason="unhealthy")
                raise InfraFailure(FailureKind.START, str(exc)) from exc
        try:
            yield sandbox
        finally:
            await self._pool.release(sandbox)

    async def verify(self, sandbox: Sandbox, task: Task, *, episode_id: str) -> Verdict:
        return verdict(await run_verifier(sandbox, task))

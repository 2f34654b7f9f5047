"""What every `Environments` adapter (Docker, process, remote) shares with the others and with the
warm pool: the SandboxStarted / SandboxStopped events, a sandbox's life (started by the backend's
`_start`, which registers how to undo each step; a failure to start is a START InfraFailure), and a
multi-step task's next step once a step is verified. Each backend keeps its own parts: how a sandbox
starts, is released and is verified.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Self

from stacx.errors import SandboxError
from stacx.events import Emit, FailureKind, SandboxStarted, SandboxStopped
from stacx.harbor.tasks import load_task
from stacx.ports import InfraFailure, Sandbox, Task, Verdict
from stacx.sandbox.steps import following, start_step, wait_healthy


class Emitting:
    """A holder of `run_id` and `emit` that records its sandboxes' starts and stops."""

    run_id: str
    emit: Emit | None

    async def started(
        self,
        sandbox_id: str,
        image: str,
        episode_id: str | None,
        start_ms: float,
        *,
        warm: bool = False,
        host: str = "",
    ) -> None:
        if self.emit is not None:
            await self.emit(
                SandboxStarted(
                    run_id=self.run_id,
                    sandbox_id=sandbox_id,
                    image=image,
                    episode_id=episode_id,
                    start_ms=start_ms,
                    warm=warm,
                    host=host,
                )
            )

    async def stopped(self, sandbox_id: str, episode_id: str | None, reason: str) -> None:
        if self.emit is not None:
            await self.emit(
                SandboxStopped(
                    run_id=self.run_id, sandbox_id=sandbox_id, episode_id=episode_id, reason=reason
                )
            )


class Lifecycle(Emitting):
    """The shared part of an `Environments` adapter; an async context manager."""

    # what a start, or a next step's setup, may raise that is a START InfraFailure
    start_errors: tuple[type[Exception], ...] = (SandboxError,)

    def __init__(self, *, run_id: str, emit: Emit | None) -> None:
        self.run_id = run_id
        self.emit = emit
        self._multi: dict[str, Task] = {}  # episode -> its multi-step task (steps' own keys)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def task(self, path: str) -> Task:
        return load_task(path)

    @contextlib.asynccontextmanager
    async def sandbox(self, task: Task, *, episode_id: str) -> AsyncIterator[Sandbox]:
        async with contextlib.AsyncExitStack() as stack:  # undoes what was started, in reverse
            try:
                sandbox = await self._start(stack, task, episode_id)
            except self.start_errors as exc:
                raise InfraFailure(FailureKind.START, str(exc)) from exc
            if task.step_tasks:
                self._multi[episode_id] = task
                stack.callback(self._multi.pop, episode_id, None)
            yield sandbox

    async def _start(
        self, stack: contextlib.AsyncExitStack, task: Task, episode_id: str
    ) -> Sandbox:
        """The backend's: a sandbox ready for the agent, each step of its start undone by `stack`."""
        raise NotImplementedError

    async def _ready(self, sandbox: Sandbox, task: Task, episode_id: str) -> None:
        """Until the agent may start: the task's healthcheck passes, its first step is set up."""
        healthcheck = task.config.environment.healthcheck
        if healthcheck is not None:
            await wait_healthy(sandbox, healthcheck)
        if task.step_tasks:
            await self._start_step(sandbox, task, task.step_tasks[0].step or "", None, episode_id)

    async def _start_step(
        self, sandbox: Sandbox, multi: Task, name: str, verified: Verdict | None, episode_id: str
    ) -> None:
        """steps.start_step (a backend may add to it: Docker collects a failed step's artifacts)."""
        await start_step(sandbox, multi, name, verified)

    async def _next_step(
        self, sandbox: Sandbox, task: Task, verified: Verdict, episode_id: str
    ) -> None:
        """After a step's verdict, the next step's setup, if its multi-step task goes on."""
        multi = self._multi.get(episode_id) if task.step else None
        after = following(multi, task.step, verified) if multi and task.step else None
        if multi is not None and after is not None:
            try:
                await self._start_step(sandbox, multi, after, verified, episode_id)
            except self.start_errors as exc:
                raise InfraFailure(FailureKind.START, str(exc)) from exc

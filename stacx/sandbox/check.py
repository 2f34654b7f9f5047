"""`stacx tasks check`: scripted agents run every task through the real verifier.

- oracle: uploads solution/ to /solution and runs `bash /solution/solve.sh` in the image's
  WORKDIR (with [solution].env), as Harbor's oracle does; must score 1.0.
- null: does nothing; must score below 1.0 (a task the null agent passes tests nothing).

The task's healthcheck, if any, must pass before the agent starts (else START failure).
Each task is one episode, recorded as events: TaskScheduled, EpisodeStarted, ToolCalled /
ToolReturned for the solve.sh exec, EpisodeFinished, then RewardAssigned or InfraFailed (an
image build or sandbox start failure is InfraFailed too). A row is ok only when the verifier
produced a reward that meets the agent's bar; an infrastructure failure is never ok.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Literal

import msgspec

from stacx.errors import SandboxError, TaskError
from stacx.events import (
    Emit,
    EpisodeFinished,
    EpisodeStarted,
    FailureKind,
    InfraFailed,
    StopReason,
    TaskScheduled,
    ToolCalled,
    ToolReturned,
    derive_id,
    new_id,
)
from stacx.sandbox.aliases import AliasMap
from stacx.sandbox.build import build_task_image
from stacx.sandbox.docker import DockerSandbox
from stacx.sandbox.health import wait_healthy
from stacx.sandbox.pool import SandboxPool
from stacx.sandbox.protocol import ExecResult
from stacx.sandbox.tasks import Task, resolve_env, task_limits
from stacx.sandbox.verifier import VerifierResult, verify

AgentName = Literal["oracle", "null"]
DEFAULT_AGENT_TIMEOUT_S = 600.0
TOOL_OUTPUT_CHARS = 8000


class CheckRow(msgspec.Struct, frozen=True, kw_only=True):
    task_id: str
    agent: str
    ok: bool
    reward: float | None = None
    failure: str | None = None  # a FailureKind
    reason: str = ""
    duration_ms: float = 0.0
    episode_id: str = ""


def passes(agent: AgentName, reward: float) -> bool:
    return reward >= 1.0 if agent == "oracle" else reward < 1.0


async def _run_oracle(
    sandbox: DockerSandbox, task: Task, emit: Emit, run_id: str, episode_id: str
) -> ExecResult:
    if not task.has_solution:
        raise TaskError(f"task {task.task_id}: no solution/solve.sh for the oracle")
    await sandbox.upload_dir(str(task.solution_dir), "/solution")
    call_id = new_id()
    command = "bash /solution/solve.sh"
    await emit(
        ToolCalled(
            run_id=run_id,
            episode_id=episode_id,
            turn=0,
            call_id=call_id,
            tool="bash",
            arguments_json=json.dumps({"command": command}),
        )
    )
    env = resolve_env(task.config.solution.env, where=f"{task.path}/task.toml: solution.env")
    agent_cfg = task.config.agent
    result = await sandbox.exec(
        ["bash", "/solution/solve.sh"],
        timeout=agent_cfg.timeout_sec or DEFAULT_AGENT_TIMEOUT_S,
        env=env or None,
        user=None if agent_cfg.user is None else str(agent_cfg.user),
    )
    output = result.stdout + result.stderr
    await emit(
        ToolReturned(
            run_id=run_id,
            episode_id=episode_id,
            turn=0,
            call_id=call_id,
            tool="bash",
            output=output[-TOOL_OUTPUT_CHARS:],
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            truncated=result.truncated or len(output) > TOOL_OUTPUT_CHARS,
            duration_ms=result.duration_ms,
        )
    )
    return result


async def check_task(
    task: Task,
    agent: AgentName,
    *,
    pool: SandboxPool,
    emit: Emit,
    run_id: str,
    aliases: AliasMap | None = None,
) -> CheckRow:
    """One episode of a scripted agent on one task, recorded through `emit`."""
    t0 = time.perf_counter()
    episode_id = new_id()
    group_id = derive_id(run_id, task.task_id, "check")

    def row(
        *, ok: bool, reward: float | None = None, failure: str | None = None, reason: str = ""
    ) -> CheckRow:
        return CheckRow(
            task_id=task.task_id,
            agent=agent,
            episode_id=episode_id,
            duration_ms=(time.perf_counter() - t0) * 1000,
            ok=ok,
            reward=reward,
            failure=failure,
            reason=reason,
        )

    async def fail(kind: FailureKind, reason: str) -> CheckRow:
        await emit(
            InfraFailed(
                run_id=run_id,
                failure_kind=kind,
                message=reason,
                episode_id=episode_id,
                task_id=task.task_id,
            )
        )
        return row(ok=False, failure=str(kind), reason=reason)

    await emit(
        TaskScheduled(run_id=run_id, task_id=task.task_id, task_path=task.path, group_id=group_id)
    )
    try:
        image = await build_task_image(task, pool.docker, aliases)
        limits = task_limits(task)
    except TaskError as exc:
        await emit(_started(run_id, episode_id, task, group_id, agent, ""))
        return await fail(FailureKind.IMAGE_BUILD, str(exc))
    await emit(_started(run_id, episode_id, task, group_id, agent, image))
    try:
        sandbox = await pool.acquire(image, limits, episode_id=episode_id)
    except SandboxError as exc:
        return await fail(FailureKind.START, str(exc))
    healthcheck = task.config.environment.healthcheck
    if healthcheck is not None:
        try:
            await wait_healthy(sandbox, healthcheck)
        except SandboxError as exc:
            await pool.release(sandbox, reason="unhealthy")
            return await fail(FailureKind.START, str(exc))
    try:
        t_agent = time.perf_counter()
        stop, n_turns, killed_by = StopReason.AGENT_DONE, 0, None
        if agent == "oracle":
            result = await _run_oracle(sandbox, task, emit, run_id, episode_id)
            n_turns = 1
            if result.timed_out:
                stop = StopReason.TIMEOUT
            if result.oom_killed or result.pids_limited:
                stop = StopReason.ERROR
                killed_by = FailureKind.OOM if result.oom_killed else FailureKind.PIDS_LIMIT
        await emit(
            EpisodeFinished(
                run_id=run_id,
                episode_id=episode_id,
                stop_reason=stop,
                n_turns=n_turns,
                duration_ms=(time.perf_counter() - t_agent) * 1000,
            )
        )
        if killed_by is not None:
            limits_text = f"memory_mb={limits.memory_mb}, pids={limits.pids}"
            return await fail(killed_by, f"solve.sh was killed by a limit ({limits_text})")
        outcome = await verify(sandbox, task, emit, run_id, episode_id)
    except TaskError as exc:
        return await fail(FailureKind.INTERNAL, str(exc))
    except SandboxError as exc:
        return await fail(FailureKind.EXEC_TRANSPORT, str(exc))
    finally:
        await pool.release(sandbox)
    if isinstance(outcome, VerifierResult):
        return row(ok=passes(agent, outcome.reward), reward=outcome.reward)
    return row(ok=False, failure=str(outcome.kind), reason=outcome.reason)


def _started(
    run_id: str, episode_id: str, task: Task, group_id: str, agent: str, image: str
) -> EpisodeStarted:
    return EpisodeStarted(
        run_id=run_id,
        episode_id=episode_id,
        task_id=task.task_id,
        group_id=group_id,
        agent=agent,
        policy=agent,
        image=image,
    )


async def check_tasks(
    tasks: list[Task],
    agent: AgentName,
    *,
    emit: Emit,
    run_id: str,
    concurrency: int = 2,
    pool: SandboxPool | None = None,
    aliases: AliasMap | None = None,
    on_row: Callable[[CheckRow], None] = lambda _row: None,
) -> list[CheckRow]:
    """Check every task with at most `concurrency` episodes at once; rows in task order."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    aliases = aliases or AliasMap.from_env()
    own_pool = pool is None
    # Each task has its own image, so a warm pool would only start containers nobody takes.
    pool = pool or SandboxPool(size=0, run_id=run_id, emit=emit)
    slots = asyncio.Semaphore(concurrency)

    async def one(task: Task) -> CheckRow:
        async with slots:
            r = await check_task(task, agent, pool=pool, emit=emit, run_id=run_id, aliases=aliases)
            on_row(r)
            return r

    try:
        return list(await asyncio.gather(*(one(t) for t in tasks)))
    finally:
        if own_pool:
            await pool.close()

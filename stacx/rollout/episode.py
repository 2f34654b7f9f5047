"""One episode, end to end: sandbox -> agent loop -> verifier -> release, as events.

Order of events of a successful attempt: EpisodeStarted, (TurnGenerated, ToolCalled,
ToolReturned)*, EpisodeFinished, RewardAssigned. An infrastructure failure anywhere raises
`InfraFailure` (a FailureKind and a message) after the sandbox is released; the caller
records it as InfraFailed and decides about a retry. A failed attempt is never scored.

The agent's own failures are not infrastructure: a malformed call is an observation, a
context overflow or an agent timeout is a StopReason, and the verifier still scores them.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import msgspec

from stacx.agents.chat import ChatFormat
from stacx.agents.loop import AgentConfig, AgentResult, run_agent
from stacx.agents.policies import Executor
from stacx.errors import EngineError, SandboxError, TaskError
from stacx.events import (
    Emit,
    EpisodeFinished,
    EpisodeStarted,
    FailureKind,
    RewardAssigned,
    StopReason,
    derive_id,
)
from stacx.sandbox.protocol import Sandbox
from stacx.sandbox.tasks import Task

DEFAULT_AGENT_TIMEOUT_S = 600.0  # for tasks whose task.toml sets no agent.timeout_sec


class InfraFailure(Exception):
    """An infrastructure failure of one attempt (never a score)."""

    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    reward: float
    metrics: dict[str, float] = msgspec.field(default_factory=dict)
    verifier_ms: float = 0.0


class Environments(Protocol):
    """Where episodes run. Adapters raise InfraFailure with the right FailureKind."""

    def sandbox(self, task: Task, *, episode_id: str) -> AbstractAsyncContextManager[Sandbox]:
        """A started sandbox for `task`, released (or recycled) on exit."""
        ...

    async def verify(self, sandbox: Sandbox, task: Task, *, episode_id: str) -> Verdict:
        """Run the task's verifier in `sandbox` after the agent finished."""
        ...


class EpisodeSpec(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    task: Task
    group_id: str
    sample_index: int
    attempt: int
    iteration: int = 0
    agent: str = "swe"
    policy: str = "student"
    timeout_s: float | None = None  # agent-loop wall time; None: the task's (or 600 s)

    @property
    def episode_id(self) -> str:
        return episode_id_for(self.run_id, self.group_id, self.sample_index, self.attempt)


def episode_id_for(run_id: str, group_id: str, sample_index: int, attempt: int) -> str:
    """Deterministic, so a redelivered task maps onto the same episodes."""
    return derive_id(run_id, group_id, sample_index, attempt)


async def run_episode(
    spec: EpisodeSpec,
    *,
    envs: Environments,
    chat: ChatFormat,
    executor: Executor,
    config: AgentConfig,
    emit: Emit,
) -> tuple[AgentResult, Verdict]:
    """Run one attempt; raises InfraFailure on infrastructure trouble (see module doc)."""
    episode_id = spec.episode_id
    await emit(
        EpisodeStarted(
            run_id=spec.run_id,
            event_id=derive_id(episode_id, "EpisodeStarted"),
            episode_id=episode_id,
            task_id=spec.task.task_id,
            group_id=spec.group_id,
            sample_index=spec.sample_index,
            agent=spec.agent,
            policy=spec.policy,
            iteration=spec.iteration,
            attempt=spec.attempt,
        )
    )
    timeout = spec.timeout_s or spec.task.config.agent.timeout_sec or DEFAULT_AGENT_TIMEOUT_S
    t0 = time.perf_counter()
    phase = FailureKind.START
    try:
        async with envs.sandbox(spec.task, episode_id=episode_id) as sandbox:
            phase = FailureKind.EXEC_TRANSPORT
            agent = run_agent(
                run_id=spec.run_id,
                episode_id=episode_id,
                instruction=spec.task.instruction,
                sandbox=sandbox,
                chat=chat,
                executor=executor,
                config=config,
                emit=emit,
            )
            try:
                result = await asyncio.wait_for(agent, timeout)
            except TimeoutError:
                # The cancelled loop's counts are lost here; the `turns` view has them.
                result = AgentResult(
                    stop_reason=StopReason.TIMEOUT, n_turns=0, n_tool_calls=0, transcript_ids=[]
                )
            await emit(
                EpisodeFinished(
                    run_id=spec.run_id,
                    event_id=derive_id(episode_id, "EpisodeFinished"),
                    episode_id=episode_id,
                    stop_reason=result.stop_reason,
                    n_turns=result.n_turns,
                    duration_ms=(time.perf_counter() - t0) * 1000,
                )
            )
            phase = FailureKind.VERIFIER_ERROR
            verdict = await envs.verify(sandbox, spec.task, episode_id=episode_id)
    except InfraFailure:
        raise
    except EngineError as exc:
        raise InfraFailure(FailureKind.ENGINE, str(exc)) from exc
    except TaskError as exc:
        raise InfraFailure(FailureKind.IMAGE_BUILD, str(exc)) from exc
    except (SandboxError, OSError) as exc:
        raise InfraFailure(phase, f"{type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        # A bug or an unwrapped library error: recorded against this attempt (so one bad
        # episode cannot fail its whole group), with the exception's type in the message.
        raise InfraFailure(FailureKind.INTERNAL, f"{type(exc).__name__}: {exc}") from exc
    await emit(
        RewardAssigned(
            run_id=spec.run_id,
            event_id=derive_id(episode_id, "RewardAssigned"),
            episode_id=episode_id,
            reward=verdict.reward,
            metrics_json=msgspec.json.encode(
                {"reward": verdict.reward, **verdict.metrics}
            ).decode(),
            verifier_ms=verdict.verifier_ms,
        )
    )
    return result, verdict

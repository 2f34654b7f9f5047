"""One episode, end to end: sandbox -> agent loop -> verifier -> release, as events.

Order of events of a successful attempt: EpisodeStarted, (TurnGenerated, ToolCalled,
ToolReturned)*, EpisodeFinished, RewardAssigned. An infrastructure failure anywhere raises
`InfraFailure` (a FailureKind and a message) after the sandbox is released; the caller
records it as InfraFailed and decides about a retry. A failed attempt is never scored.

The agent's own failures are not infrastructure: a malformed call is an observation, a
context overflow or an agent timeout is a StopReason, and the verifier still scores them (an
agent timeout's EpisodeFinished.n_turns counts the turns that ran).

Only infrastructure exceptions become InfraFailure: InfraFailure itself (the adapters'),
SandboxError, EngineError, TaskError and OSError (transport, and the harness's timeouts).
Any other exception is a bug in our code and propagates, traceback and all.

The agent and the environments come in through their ports (`Agent`, `Environments` in
stacx.ports); stacx.launch builds the concrete ones (stacx.agents.loop.SweAgent,
stacx.sandbox.environments.DockerEnvironments).
"""

from __future__ import annotations

import asyncio
import time

import msgspec

from stacx.errors import EngineError, SandboxError, TaskError
from stacx.events import (
    Emit,
    EpisodeFinished,
    EpisodeStarted,
    Event,
    FailureKind,
    Policy,
    RewardAssigned,
    StopReason,
    ToolCalled,
    TurnGenerated,
    derive_id,
)
from stacx.ports import Agent, AgentResult, Environments, InfraFailure, Task, Verdict

DEFAULT_AGENT_TIMEOUT_S = 600.0  # for tasks whose task.toml sets no agent.timeout_sec


class EpisodeSpec(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    task: Task
    group_id: str
    sample_index: int
    attempt: int
    iteration: int = 0
    agent: str = "swe"
    policy: Policy = Policy.STUDENT
    timeout_s: float | None = None  # agent-loop wall time; None: the task's (or 600 s)

    @property
    def episode_id(self) -> str:
        return episode_id_for(self.run_id, self.group_id, self.sample_index, self.attempt)


class _Steps:
    """Passes an agent's events on, remembering which turns and calls it emitted, so that an
    agent cancelled by the episode timeout still has its turns counted (EpisodeFinished)."""

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self.turns: set[int] = set()
        self.calls: set[int] = set()

    async def emit(self, event: Event) -> None:
        if isinstance(event, TurnGenerated):
            self.turns.add(event.turn)
        elif isinstance(event, ToolCalled):
            self.calls.add(event.turn)
        await self._emit(event)


def episode_id_for(run_id: str, group_id: str, sample_index: int, attempt: int) -> str:
    """Deterministic, so a redelivered task maps onto the same episodes."""
    return derive_id(run_id, group_id, sample_index, attempt)


async def run_episode(
    spec: EpisodeSpec,
    *,
    envs: Environments,
    agent: Agent,
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
            ran = _Steps(emit)
            loop = agent.run(
                run_id=spec.run_id,
                episode_id=episode_id,
                instruction=spec.task.instruction,
                sandbox=sandbox,
                emit=ran.emit,
            )
            try:
                result = await asyncio.wait_for(loop, timeout)
            except TimeoutError:
                # The cancelled loop returns nothing: count what it emitted before the timeout.
                result = AgentResult(
                    stop_reason=StopReason.TIMEOUT,
                    n_turns=len(ran.turns),
                    n_tool_calls=len(ran.calls),
                    transcript_ids=[],
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
        # OSError covers the transport (connection resets) and the harness's own timeouts
        # (TimeoutError is an OSError). Adapters wrap their library's errors (aiodocker's
        # DockerError, HTTP client errors) in SandboxError / EngineError / InfraFailure.
        raise InfraFailure(phase, f"{type(exc).__name__}: {exc}") from exc
    # Anything else is a bug in our own code: it propagates with its traceback (the actor
    # runtime logs it and redelivers the task), and is never recorded as infrastructure.
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

"""One episode attempt, end to end: sandbox -> agent loop -> verifier (and judge) -> release, as
events. Guarantees: a failed attempt is never scored; only infrastructure errors become
`InfraFailure` (raised after the sandbox is released), the agent's own failures are observations or
a StopReason, and any other exception is a bug that propagates.
Design: docs/concepts/actors.md#the-rollout-worker
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import msgspec

from stacx.errors import EngineError, SandboxError, TaskError
from stacx.events import (
    Emit,
    EpisodeFinished,
    EpisodeStarted,
    Event,
    FailureKind,
    JudgeScored,
    RewardAssigned,
    RollIn,
    StopReason,
    ToolCalled,
    ToolReturned,
    TurnGenerated,
    derive_id,
)
from stacx.events import StepFailed as StepFailedEvent
from stacx.judge import JudgeModel, JudgeResult, score
from stacx.ports import (
    Agent,
    AgentResult,
    Environments,
    InfraFailure,
    Sandbox,
    StepFailed,
    Task,
    Verdict,
)
from stacx.rubric import Rubric, combine

DEFAULT_AGENT_TIMEOUT_S = 600.0  # for tasks whose task.toml sets no agent.timeout_sec


class EpisodeSpec(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    task: Task
    group_id: str
    sample_index: int
    attempt: int
    iteration: int = 0
    agent: str = "swe"
    policy: RollIn = RollIn.STUDENT
    timeout_s: float | None = None  # agent-loop wall time; None: the task's (or 600 s)
    judged: bool = True  # False: rubrics are not scored, the verifier's reward stands alone

    @property
    def episode_id(self) -> str:
        return episode_id_for(self.run_id, self.group_id, self.sample_index, self.attempt)


class _Steps:
    """Passes an agent's events on, remembering its turns and calls (a timed-out agent's turns
    count); `offset` renumbers a later step's turns (and derives their ids) after the previous ones.
    """

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self.turns: set[int] = set()
        self.offset = 0
        self.step = ""
        # calls without a ToolReturned yet, by call id, with when they were made
        self.open: dict[str, tuple[ToolCalled, float]] = {}

    def next_step(self, name: str) -> None:
        self.offset = max(self.turns) + 1 if self.turns else self.offset
        self.step = name

    async def emit(self, event: Event) -> None:
        turn = getattr(event, "turn", None)
        if self.offset and isinstance(turn, int):
            event = msgspec.structs.replace(  # type: ignore[type-var]
                event,  # type: ignore[arg-type]
                turn=turn + self.offset,
                event_id=derive_id(event.event_id, "step", self.step),
            )
        if isinstance(event, TurnGenerated):
            self.turns.add(event.turn)
        elif isinstance(event, ToolCalled):
            self.open[event.call_id] = (event, time.perf_counter())
        elif isinstance(event, ToolReturned):
            self.open.pop(event.call_id, None)
        await self._emit(event)

    async def cut(self, timeout: float) -> None:
        """Answer every call the agent timeout interrupted with a timed-out ToolReturned."""
        for call, started in list(self.open.values()):
            await self._emit(
                ToolReturned(
                    run_id=call.run_id,
                    event_id=derive_id(call.event_id, "ToolReturned", "cut"),
                    episode_id=call.episode_id,
                    turn=call.turn,
                    call_id=call.call_id,
                    tool=call.tool,
                    timed_out=True,
                    error=f"cut by the task's agent timeout ({timeout:g} s)",
                    duration_ms=(time.perf_counter() - started) * 1000,
                )
            )
        self.open.clear()


def episode_id_for(run_id: str, group_id: str, sample_index: int, attempt: int) -> str:
    """Deterministic, so a redelivered task maps onto the same episodes."""
    return derive_id(run_id, group_id, sample_index, attempt)


def combine_steps(
    task: Task, verdicts: list[tuple[str, Verdict]], failed: StepFailed | None = None
) -> Verdict:
    """A multi-step task's verdict from its steps' in order: "mean" averages each key over the steps
    that ran (missing: 0), "final" takes the last; each step's metrics kept as
    ``step.<name>.<key>``. A `failed` step ends the list; no verdict at all: reward 0."""
    if len(verdicts) == 1 and not task.step_tasks:
        return verdicts[0][1]
    per_step = [{"reward": v.reward, **v.metrics} for _, v in verdicts]
    final = (task.config.multi_step_reward_strategy or "mean") == "final"
    if not per_step or (final and failed is not None):
        combined: dict[str, float] = {"reward": 0.0}
    elif final:
        combined = dict(per_step[-1])
    else:
        keys = sorted({k for m in per_step for k in m})
        combined = {k: sum(m.get(k, 0.0) for m in per_step) / len(per_step) for k in keys}
    for (name, _), m in zip(verdicts, per_step, strict=True):
        combined |= {f"step.{name}.{k}": x for k, x in m.items()}
    reward = combined.pop("reward")
    outputs = [f"[step {name}]\n{v.output}" for name, v in verdicts]
    if failed is not None:
        outputs.append(f"[step {failed.step}]\n{failed.exception_type}: {failed.step_message}")
    return Verdict(
        reward=reward,
        metrics=combined,
        verifier_ms=sum(v.verifier_ms for _, v in verdicts),
        output="\n".join(outputs),
    )


async def run_episode(
    spec: EpisodeSpec,
    *,
    envs: Environments,
    agent: Agent,
    emit: Emit,
    step_agent: Callable[[Task], Agent] | None = None,
    judge: JudgeModel | None = None,
) -> tuple[AgentResult, Verdict]:
    """Run one attempt, raising InfraFailure on infrastructure trouble; judged when the task has a
    rubric. A multi-step task runs `agent` on its first step, `step_agent(step)` on the others."""
    await _started(spec, emit)
    steps = spec.task.step_tasks or [spec.task]
    t0 = time.perf_counter()
    phase = FailureKind.START
    verdicts: list[tuple[str, Verdict]] = []
    failed: StepFailed | None = None
    result = AgentResult(stop_reason=StopReason.STEP_FAILED, n_turns=0, transcript_ids=[])
    n_turns = 0
    # the rubric that judges the episode (the task's, else `judge.rubric`); None: not judged
    rubric = spec.task.rubric or (judge.rubric if judge is not None else None)
    rubric = rubric if spec.judged else None
    answers: dict[str, str] = {}
    try:
        async with envs.sandbox(spec.task, episode_id=spec.episode_id) as sandbox:
            ran = _Steps(emit)
            for k, step in enumerate(steps):
                phase = FailureKind.EXEC_TRANSPORT
                acting = agent if k == 0 or step_agent is None else step_agent(step)
                result = await _act(spec, step, acting, sandbox, ran)
                n_turns += result.n_turns
                if len(steps) == 1:  # EpisodeFinished before the verifier, as ever
                    await _finished(spec, emit, result, n_turns, t0)
                if rubric is not None:  # what the agent left, before the verifier runs
                    answers = await read_answers(sandbox, rubric)
                phase = FailureKind.VERIFIER_ERROR
                verdict = await _verify(envs, sandbox, step, spec.episode_id, verdicts)
                if step.step and not spec.task.step_passes(step.step, verdict):
                    break
            if len(steps) > 1:
                await _finished(spec, emit, result, n_turns, t0)
    except StepFailed as exc:
        if not spec.task.step_tasks:
            raise  # (no steps: cannot happen) the plain InfraFailure it also is
        failed = exc
    except (EngineError, TaskError, SandboxError, OSError) as exc:
        raise _infra(exc, phase) from exc
    # Anything else is a bug in our own code: it propagates with its traceback (the actor
    # runtime logs it and redelivers the task), and is never recorded as infrastructure.
    verdict = combine_steps(spec.task, verdicts, failed)
    if rubric is not None and failed is None:
        verdict = await _judged(spec, emit, judge, rubric, answers, verdict)
    return await _score(spec, emit, result, n_turns, t0, verdict, failed)


async def _verify(
    envs: Environments,
    sandbox: Sandbox,
    step: Task,
    episode_id: str,
    verdicts: list[tuple[str, Verdict]],
) -> Verdict:
    """The step's verdict, added to `verdicts` (also when the next step's start failed after it)."""
    try:
        verdict = await envs.verify(sandbox, step, episode_id=episode_id)
    except StepFailed as exc:
        if exc.verified is not None:
            verdicts.append((step.step or "", exc.verified))
        raise
    verdicts.append((step.step or "", verdict))
    return verdict


async def read_answers(sandbox: Sandbox, rubric: Rubric) -> dict[str, str]:
    """The text of each file the rubric judges (a missing one says so, for the judge to see); a
    sandbox that cannot answer raises."""
    out: dict[str, str] = {}
    for path in rubric.judge.files:
        try:
            out[path] = (await sandbox.read_file(path)).decode("utf-8", "replace")
        except (FileNotFoundError, IsADirectoryError):
            out[path] = "(the agent left no such file)"
    return out


async def _judged(
    spec: EpisodeSpec,
    emit: Emit,
    judge: JudgeModel | None,
    rubric: Rubric,
    answers: dict[str, str],
    verdict: Verdict,
) -> Verdict:
    """The verdict with the judge's score combined in; InfraFailure(judge) when judging failed."""
    if judge is None:
        raise InfraFailure(
            FailureKind.JUDGE,
            f"task {spec.task.task_id} has a rubric ({rubric.path}) but the recipe names no "
            "judge model (set [judge] path, url or use)",
        )
    result = await score(rubric, spec.task.instruction, answers, judge, seed=spec.episode_id)
    for event in judge_events(spec.run_id, spec.episode_id, rubric, result):
        await emit(event)
    return with_judge(rubric, verdict, result)


def with_judge(rubric: Rubric, verdict: Verdict, result: JudgeResult) -> Verdict:
    """`verdict` with the judge's score joined by the rubric's [combine]; InfraFailure(judge) when
    the judge gave no score (never a 0). Shared with `stacx regrade`'s judge grader."""
    if result.score is None:
        raise InfraFailure(FailureKind.JUDGE, result.error)
    reward = combine(rubric.combine, verdict.reward, result.score)
    parts = {
        "verifier_reward": verdict.reward,
        "judge": result.score,
        **{f"judge.{k}": v for k, v in result.scores.items()},
    }
    return msgspec.structs.replace(verdict, reward=reward, metrics={**verdict.metrics, **parts})


def judge_events(
    run_id: str,
    episode_id: str,
    rubric: Rubric,
    result: JudgeResult,
    *,
    key: tuple[object, ...] = (),
) -> list[JudgeScored]:
    """One JudgeScored per judge call, `score` on the last; `key` keeps another judgement's event
    ids distinct (a regrade's grader and attempt)."""
    last = len(result.calls) - 1
    return [
        JudgeScored(
            run_id=run_id,
            event_id=derive_id(episode_id, "JudgeScored", call.call, call.attempt, *key),
            episode_id=episode_id,
            call=call.call,
            attempt=call.attempt,
            judge=result.judge,
            rubric=rubric.path,
            criteria=call.criteria,
            prompt_ids=call.prompt_ids,
            output_ids=call.output_ids,
            reply=call.reply,
            scores_json=msgspec.json.encode(call.scores).decode(),
            score=result.score if i == last else None,
            error=call.error,
            gen_ms=call.gen_ms,
        )
        for i, call in enumerate(result.calls)
    ]


def _infra(exc: Exception, phase: FailureKind) -> InfraFailure:
    """The InfraFailure an infrastructure error is: an engine's, an image build's, or for sandbox
    transport and OSError (timeouts included) the kind of the `phase` it hit."""
    if isinstance(exc, EngineError):
        return InfraFailure(FailureKind.ENGINE, str(exc))
    if isinstance(exc, TaskError):
        return InfraFailure(FailureKind.IMAGE_BUILD, str(exc))
    return InfraFailure(phase, f"{type(exc).__name__}: {exc}")


def _ids(spec: EpisodeSpec, kind: str) -> dict[str, Any]:
    """The run, event and episode ids of the episode's event of kind `kind`."""
    return {
        "run_id": spec.run_id,
        "event_id": derive_id(spec.episode_id, kind),
        "episode_id": spec.episode_id,
    }


async def _started(spec: EpisodeSpec, emit: Emit) -> None:
    await emit(
        EpisodeStarted(
            **_ids(spec, "EpisodeStarted"),
            task_id=spec.task.task_id,
            group_id=spec.group_id,
            sample_index=spec.sample_index,
            agent=spec.agent,
            policy=spec.policy,
            iteration=spec.iteration,
            attempt=spec.attempt,
        )
    )


async def _score(
    spec: EpisodeSpec,
    emit: Emit,
    result: AgentResult,
    n_turns: int,
    t0: float,
    verdict: Verdict,
    failed: StepFailed | None,
) -> tuple[AgentResult, Verdict]:
    """The episode's end: StepFailed (then EpisodeFinished) for a failed step, and RewardAssigned
    for the combined verdict."""
    if failed is not None:  # Harbor: the step's exception; the later steps never run
        await emit(
            StepFailedEvent(
                **_ids(spec, "StepFailed"),
                step=failed.step,
                exception_type=failed.exception_type,
                message=failed.step_message,
            )
        )
        result = msgspec.structs.replace(result, stop_reason=StopReason.STEP_FAILED)
        await _finished(spec, emit, result, n_turns, t0)
    await emit(
        RewardAssigned(
            **_ids(spec, "RewardAssigned"),
            reward=verdict.reward,
            metrics_json=msgspec.json.encode(
                {"reward": verdict.reward, **verdict.metrics}
            ).decode(),
            verifier_ms=verdict.verifier_ms,
            verifier_output=verdict.output,
        )
    )
    return result, verdict


async def _act(
    spec: EpisodeSpec, step: Task, agent: Agent, sandbox: Sandbox, ran: _Steps
) -> AgentResult:
    """One agent run on `step` under its timeout (an agent timeout is a StopReason)."""
    ran.next_step(step.step or "")
    timeout = spec.timeout_s or step.config.agent.timeout_sec or DEFAULT_AGENT_TIMEOUT_S
    before_turns = len(ran.turns)
    loop = agent.run(
        run_id=spec.run_id,
        episode_id=spec.episode_id,
        instruction=step.instruction,
        sandbox=sandbox,
        emit=ran.emit,
    )
    try:
        return await asyncio.wait_for(loop, timeout)
    except TimeoutError:
        # The cancelled loop returns nothing: count what it emitted before the timeout.
        await ran.cut(timeout)
        return AgentResult(
            stop_reason=StopReason.AGENT_TIMEOUT,
            n_turns=len(ran.turns) - before_turns,
            transcript_ids=[],
        )


async def _finished(
    spec: EpisodeSpec, emit: Emit, result: AgentResult, n_turns: int, t0: float
) -> None:
    await emit(
        EpisodeFinished(
            **_ids(spec, "EpisodeFinished"),
            stop_reason=result.stop_reason,
            n_turns=n_turns,
            duration_ms=(time.perf_counter() - t0) * 1000,
        )
    )

"""AggreVaTe branching: the cost-to-go of (state, action) pairs, by replaying a scored learner
episode to a turn in a fresh sandbox, taking an exploration action, letting the teacher finish and
running the verifier. Guarantees: a replay that does not reproduce the recorded state is dropped as
``InfraFailed(non_determinism)``; ids derive from (parent, turn, action), so a redelivered parent
changes nothing. Limits: assumes a deterministic environment.
Design: docs/training.md#imitation-roll-ins-teacher-signals-branches
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any, ClassVar

import msgspec

from stacx.actors.base import Actor
from stacx.agents.chat import ChatFormat
from stacx.agents.loop import AgentConfig, LoopAgent
from stacx.agents.policies import Policy
from stacx.events import (
    BranchCreated,
    CostToGoEstimated,
    Emit,
    Event,
    FailureKind,
    InfraFailed,
    RewardAssigned,
    RollIn,
    ToolReturned,
    TurnActor,
    clipped,
    derive_id,
)
from stacx.imitation.config import ImitationConfig
from stacx.ports import Environments, Generation, InfraFailure, SamplingParams, Task
from stacx.rollout.episode import EpisodeSpec, run_episode

log = logging.getLogger(__name__)


class RecordedTurn(msgspec.Struct, frozen=True, kw_only=True):
    """What the parent did at one turn, and what it saw back."""

    turn: int
    prompt_ids: list[int]
    output_ids: list[int]
    actor: TurnActor
    logprobs: list[float] | None = None
    weight_version: int | None = None
    tool_output: str | None = None  # None: the turn had no tool call
    exit_code: int | None = None
    timed_out: bool = False
    error: str = ""


class ReplayMismatch(InfraFailure):
    """The replayed prefix diverged from the recorded one (non-deterministic environment)."""

    def __init__(self, message: str) -> None:
        super().__init__(FailureKind.NON_DETERMINISM, message)


class ReplayPolicy:
    """Plays back one recorded action, after checking the prompt is the recorded state."""

    def __init__(self, recorded: RecordedTurn) -> None:
        self.recorded = recorded
        self.actor = recorded.actor

    async def act(self, prompt_ids: list[int], params: SamplingParams) -> Generation | None:
        check_prompt(self.recorded, prompt_ids)
        r = self.recorded
        return Generation(
            output_ids=list(r.output_ids),
            logprobs=r.logprobs,
            finish_reason="stop",
            weight_version=r.weight_version,
            engine="replay",
        )


class StatePolicy:
    """The policy at the branched state: checks the state, then acts at its own temperature."""

    def __init__(self, policy: Policy, temperature: float, state: RecordedTurn | None) -> None:
        self.policy = policy
        self.actor = policy.actor
        self.temperature = temperature
        self.state = state

    async def act(self, prompt_ids: list[int], params: SamplingParams) -> Generation | None:
        if self.state is not None:
            check_prompt(self.state, prompt_ids)
        return await self.policy.act(
            prompt_ids, msgspec.structs.replace(params, temperature=self.temperature)
        )


def check_prompt(recorded: RecordedTurn, prompt_ids: list[int]) -> None:
    if prompt_ids != recorded.prompt_ids:
        n = min(len(prompt_ids), len(recorded.prompt_ids))
        at = next((i for i in range(n) if prompt_ids[i] != recorded.prompt_ids[i]), n)
        raise ReplayMismatch(
            f"turn {recorded.turn}: the replayed prompt differs from the "
            f"recorded one at token {at} ({len(prompt_ids)} vs "
            f"{len(recorded.prompt_ids)} tokens)"
        )


def check_observation(recorded: RecordedTurn, event: ToolReturned) -> None:
    """Compare a replayed ToolReturned with the parent's record of the same turn."""
    got = (event.output, event.exit_code, event.timed_out, event.error)
    want = (recorded.tool_output, recorded.exit_code, recorded.timed_out, recorded.error)
    if got != want:
        raise ReplayMismatch(
            f"turn {recorded.turn}: replayed observation {got!r:.300} != recorded {want!r:.300}"
        )


def branch_seed(parent_episode_id: str, turn: int, action_index: int) -> int:
    return int(derive_id(parent_episode_id, turn, action_index, "explore")[:8], 16) & 0x7FFFFFFF


def pick_turn(parent_episode_id: str, n_turns: int, seed: int) -> int:
    """The branched turn: uniform over the parent's turns, fixed by (parent, seed)."""
    return random.Random(derive_id(parent_episode_id, seed, "turn")).randrange(n_turns)


class BranchSetup(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    task: Task
    parent_episode_id: str
    turn: int
    iteration: int = 0
    agent: AgentConfig = msgspec.field(default_factory=AgentConfig)
    exploration_temperature: float = 1.0
    teacher_temperature: float = 0.0

    def group_id(self) -> str:
        return derive_id(self.parent_episode_id, self.turn, "branches")

    def branch_id(self, action_index: int) -> str:
        return derive_id(self.parent_episode_id, self.turn, action_index, "branch")

    def spec(self, action_index: int) -> EpisodeSpec:
        return EpisodeSpec(
            run_id=self.run_id,
            task=self.task,
            group_id=self.group_id(),
            sample_index=action_index,
            attempt=0,
            iteration=self.iteration,
            agent="swe",
            policy=RollIn.BRANCH,
        )

    def created(self, action_index: int) -> BranchCreated:
        episode_id = self.spec(action_index).episode_id
        return BranchCreated(**self._fields(action_index, "BranchCreated"), episode_id=episode_id)

    def estimated(self, action_index: int, cost: float, reward: float) -> CostToGoEstimated:
        fields = self._fields(action_index, "CostToGoEstimated")
        return CostToGoEstimated(**fields, cost=cost, reward=reward)

    def _fields(self, action_index: int, kind: str) -> dict[str, Any]:
        """The fields every event of branch `action_index` carries."""
        branch_id = self.branch_id(action_index)
        return dict(
            run_id=self.run_id,
            event_id=derive_id(branch_id, kind),
            branch_id=branch_id,
            parent_episode_id=self.parent_episode_id,
            turn=self.turn,
            action_index=action_index,
            iteration=self.iteration,
        )


async def run_branch(
    setup: BranchSetup,
    action_index: int,
    recorded: list[RecordedTurn],
    *,
    envs: Environments,
    chat: ChatFormat,
    learner: Policy,
    teacher: Policy,
    emit: Emit,
) -> float | None:
    """Run one branch; its cost, or None when it was dropped."""
    t = setup.turn
    if not 0 <= t < len(recorded):
        raise ValueError(f"turn {t} is not a turn of the parent ({len(recorded)} turns)")
    spec = setup.spec(action_index)
    branch_id = setup.branch_id(action_index)
    await emit(setup.created(action_index))
    at_state = StatePolicy(learner, setup.exploration_temperature, recorded[t])
    finish = StatePolicy(teacher, setup.teacher_temperature, None)

    def executor(turn: int) -> Policy:
        return ReplayPolicy(recorded[turn]) if turn < t else at_state if turn == t else finish

    async def checked_emit(event: Event) -> None:
        await emit(event)
        if isinstance(event, ToolReturned) and event.turn < t:
            check_observation(recorded[event.turn], event)

    config = msgspec.structs.replace(
        setup.agent, seed=branch_seed(setup.parent_episode_id, t, action_index)
    )
    try:
        agent = LoopAgent(chat=chat, executor=executor, config=config)
        _result, verdict = await run_episode(spec, envs=envs, agent=agent, emit=checked_emit)
    except InfraFailure as failure:
        log.warning("branch %s dropped: %s", branch_id, failure)
        await emit(
            InfraFailed(
                run_id=setup.run_id,
                event_id=derive_id(spec.episode_id, "InfraFailed"),
                failure_kind=failure.kind,
                message=clipped(failure.message),
                episode_id=spec.episode_id,
                task_id=setup.task.task_id,
                will_retry=False,
            )
        )
        return None
    cost = 1.0 - verdict.reward
    await emit(setup.estimated(action_index, cost, verdict.reward))
    return cost


RECORDED_SQL = """SELECT t.turn, t.prompt_ids, t.output_ids, t.actor, t.logprobs, t.weight_version,
       r.output AS tool_output, r.exit_code, coalesce(r.timed_out, false) AS timed_out,
       coalesce(r.error, '') AS error
FROM (SELECT * FROM turns WHERE episode_id = $episode_id
      QUALIFY row_number() OVER (PARTITION BY turn ORDER BY _seq) = 1) t
LEFT JOIN (SELECT * FROM tool_returned WHERE episode_id = $episode_id
      QUALIFY row_number() OVER (PARTITION BY turn ORDER BY _seq) = 1) r USING (turn)
ORDER BY t.turn"""

PARENT_SQL = """SELECT s.task_id, s.iteration, s.policy, k.task_path
FROM episode_started s
LEFT JOIN (SELECT DISTINCT group_id, task_path FROM task_scheduled) k USING (group_id)
WHERE s.episode_id = $episode_id LIMIT 1"""

DONE_SQL = """SELECT count(*) FROM branch_created b
WHERE b.parent_episode_id = $episode_id AND (
    EXISTS (SELECT 1 FROM cost_to_go_estimated c WHERE c.branch_id = b.branch_id)
    OR EXISTS (SELECT 1 FROM infra_failed f WHERE f.episode_id = b.episode_id))"""


class BranchActor(Actor):
    """Branches every scored roll-in episode of an AggreVaTe run. ``make_learner(action_index)`` and
    ``make_teacher()`` give fresh policies per branch (stateful scripts work too)."""

    name: ClassVar[str] = "aggrevate-branches"
    kinds: ClassVar[tuple[type[Event], ...]] = (RewardAssigned,)
    shared: ClassVar[bool] = True
    max_inflight: ClassVar[int] = 2
    ack_wait: ClassVar[float] = 300.0

    def __init__(
        self,
        *,
        config: ImitationConfig,
        agent: AgentConfig,
        envs: Environments,
        chat: ChatFormat,
        make_learner: Callable[[int], Policy],
        make_teacher: Callable[[], Policy],
        teacher_temperature: float = 0.0,
    ) -> None:
        self.config = config
        self.agent = agent
        self.envs = envs
        self.chat = chat
        self.make_learner = make_learner
        self.make_teacher = make_teacher
        self.teacher_temperature = teacher_temperature

    async def handle(self, event: Event) -> None:
        if not isinstance(event, RewardAssigned):
            return
        e = event.episode_id
        at = {"episode_id": e}
        parent = (await self.query(PARENT_SQL, at)).to_pylist()
        if not parent or parent[0]["policy"] not in (RollIn.STUDENT, RollIn.MIXTURE):
            return  # branches, evals of other policies: not roll-ins
        if not parent[0]["task_path"]:
            log.warning("episode %s: no TaskScheduled for its group; not branched", e)
            return
        done = int((await self.query(DONE_SQL, at)).column(0)[0].as_py())
        if done >= self.config.branches:
            return  # a redelivery: every branch already has its outcome
        recorded = [
            msgspec.convert(row, RecordedTurn)
            for row in (await self.query(RECORDED_SQL, at)).to_pylist()
        ]
        if not recorded:
            return
        setup = BranchSetup(
            run_id=self.run_id,
            task=self.envs.task(parent[0]["task_path"]),
            parent_episode_id=event.episode_id,
            turn=pick_turn(event.episode_id, len(recorded), self.config.seed),
            iteration=int(parent[0]["iteration"]),
            agent=self.agent,
            exploration_temperature=self.config.exploration_temperature,
            teacher_temperature=self.teacher_temperature,
        )
        await asyncio.gather(
            *(
                run_branch(
                    setup,
                    i,
                    recorded,
                    envs=self.envs,
                    chat=self.chat,
                    learner=self.make_learner(i),
                    teacher=self.make_teacher(),
                    emit=self._emit,
                )
                for i in range(self.config.branches)
            )
        )

    async def _emit(self, event: Event) -> None:
        await self.publish(event)

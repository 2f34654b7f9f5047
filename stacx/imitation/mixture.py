"""Beta-mixture roll-ins: per turn, the teacher executes with probability beta, else the student.
Guarantees: turn ``t``'s coin depends only on (seed, t), so an episode's choices are reproducible;
``beta = 0`` never calls the teacher, ``beta = 1`` never the student.
Design: docs/training.md#imitation-roll-ins-teacher-signals-branches
"""

from __future__ import annotations

import random
from collections.abc import Callable
from contextvars import ContextVar

import msgspec

from stacx.agents.chat import ChatFormat
from stacx.agents.loop import AgentConfig, loop_agents
from stacx.agents.policies import Executor, Policy
from stacx.events import EpisodeStarted, Event, RollIn, TaskScheduled, derive_id
from stacx.imitation.config import ImitationConfig
from stacx.ports import Environments, Task
from stacx.rollout.manager import RolloutConfig, RolloutManager

_ITERATION: ContextVar[int | None] = ContextVar("stacx_roll_in_iteration", default=None)


class MixtureExecutor:
    """Chooses the teacher on turn ``t`` iff ``Random(seed, t).random() < beta``."""

    def __init__(self, student: Policy, teacher: Policy, beta: float, seed: str | int) -> None:
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta = {beta}: must be in [0, 1]")
        self.student = student
        self.teacher = teacher
        self.beta = beta
        self.seed = str(seed)

    def __call__(self, turn: int) -> Policy:
        # A string seed is hashed with SHA-512 by `random`, so it is stable across processes
        # (unlike hash()), and per-turn streams are independent of how many turns ran before.
        teacher_acts = random.Random(f"{self.seed}:{turn}").random() < self.beta
        return self.teacher if teacher_acts else self.student


class MixtureRollIn:
    """The rollout manager's executor factory for mixture roll-ins."""

    def __init__(
        self, student: Policy, teacher: Policy, config: ImitationConfig, run_seed: str
    ) -> None:
        self.student = student
        self.teacher = teacher
        self.config = config
        self.run_seed = run_seed

    def seed_for(self, iteration: int, task_id: str, sample_index: int) -> str:
        return derive_id(self.run_seed, self.config.seed, iteration, task_id, sample_index)

    def __call__(self, task: Task, sample_index: int) -> Executor:
        iteration = _ITERATION.get() or 0  # the TaskScheduled's (MixtureRolloutManager.handle)
        return MixtureExecutor(
            self.student,
            self.teacher,
            self.config.beta(iteration),
            self.seed_for(iteration, task.task_id, sample_index),
        )


class MixtureRolloutManager(RolloutManager):
    """A RolloutManager whose episodes record their roll-in (policy "mixture", beta of the
    TaskScheduled's iteration)."""

    def __init__(
        self,
        *,
        roll_in: MixtureRollIn,
        config: RolloutConfig,
        envs: Environments,
        chat: ChatFormat,
        agent: AgentConfig,
        serves: Callable[[], int | None] | None = None,
    ) -> None:
        super().__init__(
            config=config, envs=envs, make_agent=loop_agents(chat, agent, roll_in), serves=serves
        )
        self.roll_in = roll_in

    async def handle(self, event: Event) -> None:
        if isinstance(event, TaskScheduled):
            _ITERATION.set(event.iteration)  # this task's context only (see module docstring)
        await super().handle(event)

    async def emit_episode_event(self, event: Event) -> None:
        if isinstance(event, EpisodeStarted):
            event = msgspec.structs.replace(
                event, policy=RollIn.MIXTURE, beta=self.roll_in.config.beta(event.iteration)
            )
        await self.publish(event)

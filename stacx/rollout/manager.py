"""The rollout manager: an actor that turns TaskScheduled into scored episode groups.

Work queue: every worker with the same `name` shares one durable consumer on TaskScheduled,
so each task goes to one worker; a worker runs `max_inflight` tasks and at most
`concurrency` episodes at once (one semaphore across its tasks).

Per task: `n_samples` samples form the group (`group_id` from the event). Each sample runs
attempts until one is scored or `max_attempts` infrastructure failures happened; every
failure is an InfraFailed (`will_retry` says whether another attempt follows), never a 0.

Idempotency: episode ids are `derive_id(run_id, group_id, sample_index, attempt)`. Before a
sample runs, the log is asked (SQL) what its attempts did: a scored sample or one whose
failures are final is skipped, so a TaskScheduled redelivered after a crash does not
double-count; an attempt that started but never ended (its worker died) is closed with an
InfraFailed(internal, will_retry) and the next attempt number is used.
"""

from __future__ import annotations

import asyncio
import logging
from typing import ClassVar

import msgspec

from stacx.actors.base import Actor
from stacx.errors import TaskError
from stacx.events import Event, FailureKind, InfraFailed, Policy, TaskScheduled, derive_id
from stacx.ports import Environments, InfraFailure, MakeAgent, Task
from stacx.rollout.episode import EpisodeSpec, episode_id_for, run_episode

log = logging.getLogger(__name__)


class RolloutConfig(msgspec.Struct, frozen=True, kw_only=True):
    agent: str = "swe"  # recorded in EpisodeStarted.agent
    policy: Policy = Policy.STUDENT  # recorded in EpisodeStarted.policy
    concurrency: int = 2
    max_attempts: int = 3
    episode_timeout_s: float | None = None  # None: each task's agent.timeout_sec


class SampleState(msgspec.Struct, frozen=True, kw_only=True):
    done: bool
    next_attempt: int
    dangling: list[tuple[str, int]]  # (episode_id, attempt) started, never ended


class RolloutManager(Actor):
    """See the module docstring. Construct, then `run.spawn(manager)`."""

    name: ClassVar[str] = "rollout"
    kinds: ClassVar[tuple[type[Event], ...]] = (TaskScheduled,)
    shared: ClassVar[bool] = True
    max_inflight: ClassVar[int] = 8
    ack_wait: ClassVar[float] = 120.0

    def __init__(
        self,
        *,
        config: RolloutConfig,
        envs: Environments,
        make_agent: MakeAgent,
    ) -> None:
        self.config = config
        self.envs = envs
        self.make_agent = make_agent
        self._slots = asyncio.Semaphore(config.concurrency)
        self._groups: dict[str, asyncio.Lock] = {}

    async def handle(self, event: Event) -> None:
        if not isinstance(event, TaskScheduled):
            return
        try:
            task = self.envs.task(event.task_path)
        except TaskError as exc:
            # A task that cannot even be read fails for good, once, at task level.
            await self.publish(
                InfraFailed(
                    run_id=self.run_id,
                    event_id=derive_id(self.run_id, event.group_id, "InfraFailed"),
                    failure_kind=FailureKind.INTERNAL,
                    message=str(exc),
                    task_id=event.task_id,
                    will_retry=False,
                )
            )
            return
        # Two deliveries of one group in this worker run one after the other, so the second
        # sees the first's episodes in the log and skips them.
        async with self._groups.setdefault(event.group_id, asyncio.Lock()):
            states = await self._states(event)
            await asyncio.gather(
                *(self._sample(event, task, i, states.get(i)) for i in range(event.n_samples))
            )

    async def _sample(
        self, event: TaskScheduled, task: Task, index: int, state: SampleState | None
    ) -> None:
        state = state or SampleState(done=False, next_attempt=0, dangling=[])
        if state.done:
            return
        retry = state.next_attempt < self.config.max_attempts
        for episode_id, attempt in state.dangling:
            await self._failed(
                event,
                episode_id,
                attempt,
                FailureKind.INTERNAL,
                "abandoned: its worker stopped before the episode ended",
                retry,
            )
        for attempt in range(state.next_attempt, self.config.max_attempts):
            spec = EpisodeSpec(
                run_id=self.run_id,
                task=task,
                group_id=event.group_id,
                sample_index=index,
                attempt=attempt,
                iteration=event.iteration,
                agent=self.config.agent,
                policy=self.config.policy,
                timeout_s=self.config.episode_timeout_s,
            )
            async with self._slots:
                try:
                    await run_episode(
                        spec,
                        envs=self.envs,
                        agent=self.make_agent(task, index),
                        emit=self.emit_episode_event,
                    )
                    return
                except InfraFailure as failure:
                    retry = attempt + 1 < self.config.max_attempts
                    log.warning("episode %s attempt %d: %s", spec.episode_id, attempt, failure)
                    await self._failed(
                        event, spec.episode_id, attempt, failure.kind, failure.message, retry
                    )

    async def emit_episode_event(self, event: Event) -> None:
        """Publish one event of an episode (the hook a subclass overrides to annotate them,
        e.g. the mixture roll-in's policy and beta on EpisodeStarted)."""
        await self.publish(event)

    async def _failed(
        self,
        event: TaskScheduled,
        episode_id: str,
        attempt: int,
        kind: FailureKind,
        message: str,
        retry: bool,
    ) -> None:
        await self.publish(
            InfraFailed(
                run_id=self.run_id,
                event_id=derive_id(episode_id, "InfraFailed"),
                failure_kind=kind,
                message=message[:4000],
                episode_id=episode_id,
                task_id=event.task_id,
                attempt=attempt,
                will_retry=retry,
            )
        )

    async def _states(self, event: TaskScheduled) -> dict[int, SampleState]:
        """What the log says about this group's samples (see the module docstring)."""
        table = await self.query(
            "SELECT s.sample_index, s.attempt, s.episode_id, "
            "EXISTS (SELECT 1 FROM reward_assigned r WHERE r.episode_id = s.episode_id) AS scored, "
            # episode-level failures only (`turn` set: a teacher's, on one visited state)
            "EXISTS (SELECT 1 FROM infra_failed f WHERE f.episode_id = s.episode_id "
            "        AND f.turn IS NULL) AS failed, "
            "EXISTS (SELECT 1 FROM infra_failed f WHERE f.episode_id = s.episode_id "
            "        AND f.turn IS NULL AND NOT f.will_retry) AS final "
            "FROM episode_started s WHERE s.group_id = ? ORDER BY s.sample_index, s.attempt",
            [event.group_id],
        )
        states: dict[int, SampleState] = {}
        for row in table.to_pylist():
            index, attempt = int(row["sample_index"]), int(row["attempt"])
            prev = states.get(index, SampleState(done=False, next_attempt=0, dangling=[]))
            # Expected ids only: a foreign episode in the group (another run's id) is ignored.
            if row["episode_id"] != episode_id_for(self.run_id, event.group_id, index, attempt):
                continue
            dangling = list(prev.dangling)
            if not (row["scored"] or row["failed"]):
                dangling.append((row["episode_id"], attempt))
            states[index] = SampleState(
                done=prev.done or bool(row["scored"]) or bool(row["final"]),
                next_attempt=max(prev.next_attempt, attempt + 1),
                dangling=dangling,
            )
        return states

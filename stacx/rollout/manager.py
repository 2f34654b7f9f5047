"""The rollout manager: an actor that turns TaskScheduled into scored episode groups (a shared work
queue; attempts until one is scored or ``max_attempts`` infrastructure failures, each an
InfraFailed, never a 0). Guarantees: episode ids derive from (group, sample, attempt) and the log is
asked first, so a redelivered task never double-counts.
Design: docs/concepts/actors.md#the-rollout-worker
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import ClassVar

import msgspec

from stacx.actors.base import Actor
from stacx.errors import TaskError
from stacx.events import (
    Event,
    FailureKind,
    InfraFailed,
    RollIn,
    TaskScheduled,
    clipped,
    derive_id,
)
from stacx.judge import JudgeModel
from stacx.ports import Environments, InfraFailure, MakeAgent, Task
from stacx.rollout.episode import EpisodeSpec, episode_id_for, run_episode

log = logging.getLogger(__name__)


class RolloutConfig(msgspec.Struct, frozen=True, kw_only=True):
    agent: str = "swe"  # recorded in EpisodeStarted.agent
    policy: RollIn = RollIn.STUDENT  # recorded in EpisodeStarted.policy
    concurrency: int = 2
    max_attempts: int = 3
    episode_timeout_s: float | None = None  # None: each task's agent.timeout_sec
    judged: bool = True  # False: tasks' rubrics are not scored (stacx tasks check)


class SampleState(msgspec.Struct, frozen=True, kw_only=True):
    done: bool
    next_attempt: int
    dangling: list[tuple[str, int]]  # (episode_id, attempt) started, never ended


class RolloutManager(Actor):
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
        serves: Callable[[], int | None] | None = None,
        judge: JudgeModel | None = None,
    ) -> None:
        """``serves``: the version the worker's engine serves now (a sync-mode task waits for its
        ``weight_version``); ``judge``: scores rubric tasks. Both optional."""
        self.judge = judge
        self.config = config
        self.envs = envs
        self.make_agent = make_agent
        self.serves = serves
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
                    failure_kind=FailureKind.TASK_INVALID,
                    message=str(exc),
                    task_id=event.task_id,
                    will_retry=False,
                )
            )
            return
        await self._await_weights(event)
        # Two deliveries of one group in this worker run one after the other, so the second
        # sees the first's episodes in the log and skips them.
        async with self._groups.setdefault(event.group_id, asyncio.Lock()):
            states = await self._states(event)
            await asyncio.gather(
                *(self._sample(event, task, i, states.get(i)) for i in range(event.n_samples))
            )

    async def _await_weights(self, event: TaskScheduled) -> None:
        """Until the engine serves ``event.weight_version`` (heartbeats keep the task)."""
        if self.serves is None or event.weight_version is None:
            return
        waited = 0.0
        while (self.serves() or 0) < event.weight_version:
            if waited == 0.0:
                log.info("%s: waiting for weights v%d", event.group_id, event.weight_version)
            await asyncio.sleep(0.05)
            waited += 0.05

    async def _sample(
        self, event: TaskScheduled, task: Task, index: int, state: SampleState | None
    ) -> None:
        state = state or SampleState(done=False, next_attempt=0, dangling=[])
        if state.done:
            return
        retry = state.next_attempt < self.config.max_attempts
        abandoned = "abandoned: its worker stopped before the episode ended"
        for episode_id, attempt in state.dangling:
            await self._failed(event, episode_id, attempt, FailureKind.INTERNAL, abandoned, retry)
        previous = ""  # the signature of this run's last failed attempt (InfraFailure.signature)
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
                judged=self.config.judged,
            )
            async with self._slots:
                try:
                    await run_episode(
                        spec,
                        envs=self.envs,
                        # a multi-step task's agents act on its steps, one each
                        agent=self.make_agent((task.step_tasks or [task])[0], index),
                        emit=self.emit_episode_event,
                        step_agent=lambda step: self.make_agent(step, index),
                        judge=self.judge,
                    )
                    return
                except InfraFailure as failure:
                    # a failure the configuration causes, or one that repeats the previous
                    # attempt's exactly, is deterministic: recorded once more, never retried
                    again = failure.retryable and not (previous and failure.signature() == previous)
                    retry = again and attempt + 1 < self.config.max_attempts
                    log.warning("episode %s attempt %d: %s", spec.episode_id, attempt, failure)
                    await self._failed(
                        event, spec.episode_id, attempt, failure.kind, failure.message, retry
                    )
                    if not retry:
                        return
                    previous = failure.signature()

    async def emit_episode_event(self, event: Event) -> None:
        """Publish one event of an episode (a subclass annotates them: the mixture roll-in's
        policy)."""
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
                message=clipped(message),
                episode_id=episode_id,
                task_id=event.task_id,
                attempt=attempt,
                will_retry=retry,
            )
        )

    async def _states(self, event: TaskScheduled) -> dict[int, SampleState]:
        """What the log says about this group's samples' attempts."""
        table = await self.query(
            "SELECT sample_index, attempt, episode_id, scored, failed, final FROM attempts "
            "WHERE group_id = ? ORDER BY sample_index, attempt",
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

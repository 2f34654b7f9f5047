"""The scheduler (orchestrator): decides, from the log alone, which tasks to schedule next and when
the run is done. Guarantees: every TaskScheduled has a deterministic id, so a restarted scheduler
emits exactly what is missing; an iteration's tasks are a pure function of (task ids, seed,
iteration).
Design: docs/training.md#the-scheduler
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from typing import ClassVar

import msgspec
import pyarrow as pa

from stacx.actors.base import Actor, Params, Query
from stacx.events import (
    CostToGoEstimated,
    Event,
    InfraFailed,
    RewardAssigned,
    TaskScheduled,
    TeacherLabeled,
    TeacherScored,
    WeightsPublished,
    derive_id,
    subject,
)
from stacx.train import units
from stacx.train.algorithms import ready_threshold
from stacx.train.config import TrainerConfig

log = logging.getLogger(__name__)


class TaskRef(msgspec.Struct, frozen=True):
    task_id: str
    path: str


class EvalPlan(msgspec.Struct, frozen=True, kw_only=True):
    """Periodic evaluation ([eval]): `samples` of every task at each of `versions`."""

    tasks: list[TaskRef]
    samples: int = 1
    versions: list[int] = msgspec.field(default_factory=list)


def eval_versions(every: int, steps: int, *, at_start: bool = True) -> list[int]:
    """Versions evaluated: every `every`-th up to `steps`, the last one always, 0 if `at_start`."""
    versions = {v for v in range(every, steps + 1, every)} | {steps}
    return sorted(versions | ({0} if at_start else set()))


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """What the scheduler needs from the recipe (pure data, so the core is testable)."""

    tasks: list[TaskRef]
    per_iteration: int
    group_size: int
    seed: int = 0
    steps: int = 1  # training: weight versions to reach
    mode: str = "sync"  # sync | async
    max_staleness: int = 1
    eval: bool = False
    max_iterations: int = 0  # 0: 4 x steps
    trainer: TrainerConfig | None = None  # for the trainer's readiness (refills); None: no refills
    evals: EvalPlan | None = None  # periodic eval during training; None: none

    @property
    def steps_per_iteration(self) -> int:
        return self.trainer.steps_per_iteration if self.trainer is not None else 1

    @property
    def iterations(self) -> int:
        """Rollout iterations that the steps need (one per ``steps_per_iteration`` steps)."""
        return -(-self.steps // self.steps_per_iteration)

    @property
    def iteration_cap(self) -> int:
        return self.max_iterations or 4 * self.iterations


class LogState(msgspec.Struct, frozen=True, kw_only=True):
    """What the log says, in one query (see STATE_SQL)."""

    scheduled: frozenset[str]  # group ids with a TaskScheduled
    iterations: int  # rollout iterations with any TaskScheduled (they are contiguous from 0)
    version: int  # latest published weight version (0: none)
    samples_done: int  # samples scored or failed for good
    samples_scheduled: int  # samples of every scheduled group
    groups_lost: int  # groups that failed as a whole (task unreadable) for good
    ready_units: int | None = None  # units the trainer could step on now (None: unknown)
    eval_pending: int = 0  # samples of periodic-eval groups not done yet
    evals_scheduled: frozenset[int] = frozenset()  # versions whose eval groups are scheduled
    units_waiting: int = 0  # done samples whose unit still waits (teacher labels, scores, branches)

    @property
    def settled(self) -> bool:
        """Nothing in flight: every scheduled sample scored or failed for good, no unit waiting."""
        return self.samples_done >= self.samples_scheduled and self.units_waiting == 0


def tasks_for_iteration(
    tasks: list[TaskRef], per_iteration: int, seed: int, iteration: int
) -> list[TaskRef]:
    """The tasks of `iteration`: consecutive slots of an endless sequence of shuffled epochs (every
    task once per epoch); deterministic in (seed, iteration)."""
    if not tasks:
        return []
    order = sorted(tasks, key=lambda t: t.task_id)
    out = []
    for slot in range(iteration * per_iteration, (iteration + 1) * per_iteration):
        epoch, pos = divmod(slot, len(order))
        shuffled = list(order)
        random.Random(f"{seed}:{epoch}").shuffle(shuffled)
        out.append(shuffled[pos])
    return out


def group_id_for(run_id: str, iteration: int, slot: int) -> str:
    return derive_id(run_id, "group", iteration, slot)


def iteration_events(
    run_id: str, plan: Plan, iteration: int, version: int | None = None
) -> list[TaskScheduled]:
    """The TaskScheduled events of one iteration (ids derived); in sync mode pinned to version
    ``iteration * steps_per_iteration``, or ``version`` for a refill beyond it."""
    if plan.eval:
        chosen = plan.tasks
    else:
        chosen = tasks_for_iteration(plan.tasks, plan.per_iteration, plan.seed, iteration)
    return [
        TaskScheduled(
            run_id=run_id,
            event_id=derive_id(run_id, "TaskScheduled", iteration, slot),
            task_id=t.task_id,
            task_path=t.path,
            group_id=group_id_for(run_id, iteration, slot),
            n_samples=plan.group_size,
            iteration=iteration,
            split="eval" if plan.eval else "train",
            weight_version=(
                min(iteration * plan.steps_per_iteration, version)
                if version is not None and plan.mode == "sync" and not plan.eval
                else None
            ),
        )
        for slot, t in enumerate(chosen)
    ]


def eval_events(run_id: str, evals: EvalPlan, version: int) -> list[TaskScheduled]:
    """The TaskScheduled events of the periodic eval of `version` (role and split "eval", pinned to
    it, `iteration` = the version; ids derived)."""
    return [
        TaskScheduled(
            run_id=run_id,
            event_id=derive_id(run_id, "EvalScheduled", version, slot),
            task_id=t.task_id,
            task_path=t.path,
            group_id=derive_id(run_id, "eval-group", version, slot),
            n_samples=evals.samples,
            iteration=version,
            split="eval",
            weight_version=version,
            role="eval",
        )
        for slot, t in enumerate(evals.tasks)
    ]


def evals_due(plan: Plan, state: LogState) -> list[int]:
    """Versions whose periodic eval should have been scheduled by now (published ones)."""
    if plan.evals is None:
        return []
    return [v for v in plan.evals.versions if v <= state.version]


def starved(plan: Plan, state: LogState) -> bool:
    """The trainer cannot step on what exists (too few ready units) and nothing is in flight."""
    if plan.trainer is None or state.ready_units is None:
        return False
    return state.settled and state.ready_units < ready_threshold(plan.trainer)


def iterations_due(plan: Plan, state: LogState) -> list[int]:
    """Iterations due by now: k once ``k * S <= version`` (sync; S = ``steps_per_iteration``) or ``k
    <= version // S + max_staleness`` (async), plus refills while starved, up to the cap."""
    if plan.eval:
        return [0]
    ahead = 0 if plan.mode == "sync" else max(0, plan.max_staleness)
    last = min(plan.iterations - 1, state.version // plan.steps_per_iteration + ahead)
    due = list(range(0, last + 1))
    # no refill once the last version is out: its eval may still run, but the trainer is done
    training = state.version < plan.steps
    refill = training and starved(plan, state) and state.iterations < plan.iteration_cap
    if refill and state.iterations > last:
        due = list(range(0, state.iterations + 1))
    return due


def verdict(plan: Plan, state: LogState) -> str | None:
    """None while the run should go on; else why it ends ("completed" or "starved: ...")."""
    if plan.eval:
        total = len(plan.tasks) * plan.group_size
        done = state.samples_done + state.groups_lost * plan.group_size >= total
        return "completed" if done else None
    if state.version >= plan.steps:
        # the last version's eval is scheduled at this tick and must be scored before the end
        if plan.evals is not None and (state.eval_pending or not _evals_scheduled(plan, state)):
            return None
        return "completed"
    if starved(plan, state) and state.iterations >= plan.iteration_cap:
        return (
            f"starved: {state.iterations} iterations rolled out (tasks.max_iterations) and "
            f"the trainer still lacks data for step {state.version + 1}"
        )
    return None


def _evals_scheduled(plan: Plan, state: LogState) -> bool:
    return (
        not plan.evals
        or not plan.evals.tasks
        or set(evals_due(plan, state)) <= set(state.evals_scheduled)
    )


STATE_SQL = """
WITH groups AS (SELECT * FROM scheduled_groups WHERE NOT is_eval),
evals AS (  -- a group that failed as a whole (its task is unreadable) is not waited for
    SELECT * FROM scheduled_groups WHERE is_eval AND NOT lost
)
SELECT
  (SELECT coalesce(list(group_id), []) FROM scheduled_groups) AS groups,
  (SELECT count(DISTINCT iteration) FROM groups) AS iterations,
  (SELECT coalesce(sum(n_samples), 0) FROM scheduled_groups) AS samples_scheduled,
  (SELECT coalesce(max(version), 0) FROM weights_published) AS version,
  (SELECT count(*) FROM samples
      WHERE done AND group_id IN (SELECT group_id FROM scheduled_groups)) AS samples_done,
  (SELECT count(*) FROM tasks_lost) AS groups_lost,
  (SELECT coalesce(sum(n_samples), 0) FROM evals)
      - (SELECT count(*) FROM samples WHERE done AND group_id IN (SELECT group_id FROM evals))
      AS eval_pending,
  (SELECT coalesce(list(DISTINCT iteration), []) FROM evals) AS evals_scheduled
"""
"""The scheduler's view of the log, one row: it selects from the named views (`scheduled_groups`:
which groups are eval groups and lost; `tasks_lost`; `samples`: which samples are done)."""


async def read_state(query: Query, plan: Plan) -> LogState:
    row = (await query(STATE_SQL)).to_pylist()[0]
    version = int(row["version"])
    ready: int | None = None
    waiting = 0
    if plan.trainer is not None and not plan.eval:
        cfg = plan.trainer
        # one query, so one snapshot: read apart, a teacher label recorded between the two
        # reads made a run look starved (nothing waiting, yet a unit short) and roll out a
        # refill iteration that no step would train on
        sql = (
            f"SELECT (SELECT count(*) FROM ({units.ready_units_sql(cfg)})) AS ready, "
            f"({units.waiting_sql(cfg)}) AS waiting"
        )
        got = (await query(sql, units.params(cfg, sql, version))).to_pylist()[0]
        ready, waiting = int(got["ready"]), int(got["waiting"])
    return LogState(
        scheduled=frozenset(row["groups"] or []),
        iterations=int(row["iterations"]),
        version=version,
        samples_done=int(row["samples_done"]),
        samples_scheduled=int(row["samples_scheduled"]),
        groups_lost=int(row["groups_lost"]),
        eval_pending=int(row["eval_pending"]),
        evals_scheduled=frozenset(int(v) for v in row["evals_scheduled"] or []),
        ready_units=ready,
        units_waiting=waiting,
    )


class Scheduler(Actor):
    """``done`` is set once the log says the run is complete. Woken by the events in ``wake_on``
    (a plain subscription; at most every ``min_tick_s``) or every ``poll_s``, it recomputes from
    the log: nothing to lose."""

    name: ClassVar[str] = "scheduler"
    kinds: ClassVar[tuple[type[Event], ...]] = ()
    # every event that changes what it reads (versions, finished samples, failures, and the
    # teacher's signals that complete imitation units); ``poll_s`` is only the safety net
    wake_on: ClassVar[tuple[type[Event], ...]] = (
        WeightsPublished,
        RewardAssigned,
        InfraFailed,
        TeacherLabeled,
        TeacherScored,
        CostToGoEstimated,
    )

    def __init__(self, plan: Plan, *, poll_s: float = 3.0, min_tick_s: float = 0.25) -> None:
        self.plan = plan
        self.poll_s = poll_s
        # ticks at most this often: under a stream of rewards the log's state is read once per
        # interval, not once per reward (each read is a few view queries in the launcher)
        self.min_tick_s = min_tick_s
        self.done = asyncio.Event()
        self.state: LogState | None = None
        self.verdict: str | None = None

    async def tick(self) -> bool:
        """Schedule what is due and missing; return whether the run is done."""
        while True:
            state = await read_state(self._read, self.plan)
            self.state = state
            self.verdict = verdict(self.plan, state)
            if self.verdict is not None:
                return True
            # a version's eval before its training groups: a sync-mode trainer's gate
            # (stacx.train.units.gate_sql) then always sees the eval it must wait for
            due = []
            if self.plan.evals is not None:
                due += [
                    ev
                    for version in evals_due(self.plan, state)
                    for ev in eval_events(self.run_id, self.plan.evals, version)
                ]
            due += [
                ev
                for iteration in iterations_due(self.plan, state)
                for ev in iteration_events(self.run_id, self.plan, iteration, state.version)
            ]
            missing = [ev for ev in due if ev.group_id not in state.scheduled]
            for ev in missing:
                await self.publish(ev)
            if not missing:  # re-read after sending: async mode may have more due
                return False

    async def _read(self, sql: str, params: Params = None, /) -> pa.Table:
        # A barrier: it is woken by other actors' events (rewards, weights, failures) that are
        # not delivered to it, and must see them in the log when it reads.
        return await self.query(sql, params, barrier=True)

    async def run(self, stop: asyncio.Event) -> None:
        wake = asyncio.Event()
        nc = self.ctx.nc  # the run's connection: a core subscription, not a consumer

        async def on_msg(_msg: object) -> None:
            wake.set()

        subs = [
            await nc.subscribe(subject(self.run_id, k.__name__), cb=on_msg) for k in self.wake_on
        ]
        try:
            last = -math.inf
            while not stop.is_set():
                await asyncio.sleep(max(0.0, last + self.min_tick_s - time.monotonic()))
                last = time.monotonic()
                wake.clear()
                if await self.tick():
                    self.done.set()
                    await stop.wait()
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), self.poll_s)
        finally:
            for s in subs:
                with contextlib.suppress(Exception):
                    await s.unsubscribe()

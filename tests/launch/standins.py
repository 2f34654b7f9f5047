"""Stand-in roles for the launcher-mechanics tests (test_launch.py, test_plot.py): real actors
on the real bus and log, with no model or Docker, for checks that do not depend on what the
roles compute. Selected through the recipe's `placement.builders`. They prove nothing about
the real rollout manager or trainer: crash-resume and Ray placement are tested with the real
roles (test_crash.py, test_ray.py).

- rollout: for each sample of a TaskScheduled, publishes EpisodeStarted, one TurnGenerated
  (stamped with the latest published weight version), EpisodeFinished and RewardAssigned, with
  ids derived like the real rollout manager's; reward = 1 with probability rising with the version.
- trainer: when every group of iteration `v` (v = latest version) is scored, publishes
  TrainStepFinished(step v+1) and WeightsPublished(v+1), ids derived from the step.
- holding_rollout (test_interrupt.py): holds each TaskScheduled for `HOLD_S` and records in the
  run directory's `HELD` file whether it finished that work or was cancelled first.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar

from stacx import events as ev
from stacx.actors.base import Actor
from stacx.launch.placement import ActorEnv
from stacx.launch.recipe import Recipe

DELAY_S = 0.05  # EpisodeStarted to its turn: briefly in flight, as real episodes are
HOLD_S = 8.0  # far past INTERRUPT_GRACE_S (2 s), far short of STOP_GRACE_S (30 s)
HELD = "held.txt"  # holding_rollout's record, in the run directory


class FakeRollout(Actor):
    name: ClassVar[str] = "rollout"
    kinds: ClassVar[tuple[type[ev.Event], ...]] = (ev.TaskScheduled,)
    shared: ClassVar[bool] = True
    max_inflight: ClassVar[int] = 4
    ack_wait: ClassVar[float] = 5.0

    async def handle(self, event: ev.Event) -> None:
        assert isinstance(event, ev.TaskScheduled)
        version = (
            (await self.query("select coalesce(max(version), 0) from weights_published"))
            .column(0)[0]
            .as_py()
        )
        for i in range(event.n_samples):
            ep = ev.derive_id(self.run_id, event.group_id, i, 0)
            await self.publish(
                ev.EpisodeStarted(
                    run_id=self.run_id,
                    event_id=ev.derive_id(ep, "EpisodeStarted"),
                    episode_id=ep,
                    task_id=event.task_id,
                    group_id=event.group_id,
                    sample_index=i,
                    iteration=event.iteration,
                )
            )
            await asyncio.sleep(DELAY_S)
            await self.publish(
                ev.TurnGenerated(
                    run_id=self.run_id,
                    event_id=ev.derive_id(ep, "turn", 0),
                    episode_id=ep,
                    turn=0,
                    prompt_ids=[1, 2, 3],
                    output_ids=[4, 5],
                    logprobs=[-0.1, -0.2],
                    weight_version=version,
                    engine="standin",
                )
            )
            await self.publish(
                ev.EpisodeFinished(
                    run_id=self.run_id,
                    event_id=ev.derive_id(ep, "EpisodeFinished"),
                    episode_id=ep,
                    stop_reason=ev.StopReason.SUBMITTED,
                    n_turns=1,
                )
            )
            reward = float(random.Random(ep).random() < 0.3 + 0.3 * version)
            await self.publish(
                ev.RewardAssigned(
                    run_id=self.run_id,
                    event_id=ev.derive_id(ep, "RewardAssigned"),
                    episode_id=ep,
                    reward=reward,
                )
            )


class FakeTrainer(Actor):
    name: ClassVar[str] = "trainer"
    kinds: ClassVar[tuple[type[ev.Event], ...]] = (ev.RewardAssigned,)

    def __init__(self, per_iteration: int, group_size: int) -> None:
        self.per_iteration = per_iteration
        self.group_size = group_size

    async def on_start(self) -> None:
        await self.maybe_step()

    async def handle(self, event: ev.Event) -> None:
        await self.maybe_step()

    async def maybe_step(self) -> None:
        row = (
            await self.query(f"""
            with v as (select coalesce(max(version), 0) as v from weights_published)
            select v.v, (select count(*) from (
                select group_id from episodes where status = 'scored' and iteration = v.v
                group by group_id having count(*) >= {self.group_size})) as complete,
              (select avg(reward) from episodes where status = 'scored' and iteration = v.v) as r,
              (select list(episode_id order by episode_id) from episodes
                 where status = 'scored' and iteration = v.v) as eps
            from v""")
        ).to_pylist()[0]
        if row["complete"] < self.per_iteration:
            return
        step = int(row["v"]) + 1
        await self.publish(
            ev.TrainStepFinished(
                run_id=self.run_id,
                event_id=ev.derive_id(self.run_id, "step", step),
                step=step,
                algorithm="grpo",
                loss=1.0 / step,
                weight_version=step,
                reward_mean=row["r"],
                n_samples=self.per_iteration * self.group_size,
                episode_ids=row["eps"],
            )
        )
        await self.publish(
            ev.WeightsPublished(
                run_id=self.run_id,
                event_id=ev.derive_id(self.run_id, "weights", step),
                version=step,
                path=f"/nowhere/v{step}",
                sha256="0" * 64,
                step=step,
            )
        )


@contextlib.asynccontextmanager
async def rollout(recipe: Recipe, env: ActorEnv, index: int) -> AsyncIterator[list[Actor]]:
    yield [FakeRollout()]


@contextlib.asynccontextmanager
async def trainer(recipe: Recipe, env: ActorEnv, index: int) -> AsyncIterator[list[Actor]]:
    yield [FakeTrainer(recipe.tasks.per_iteration, recipe.tasks.group_size)]


class BuggyRollout(FakeRollout):
    """A rollout worker with a programming error: its first TaskScheduled raises TypeError."""

    async def handle(self, event: ev.Event) -> None:
        raise TypeError("a bug in a rollout worker")


@contextlib.asynccontextmanager
async def buggy_rollout(recipe: Recipe, env: ActorEnv, index: int) -> AsyncIterator[list[Actor]]:
    yield [BuggyRollout()]


class HoldingRollout(Actor):
    """A rollout worker whose every task takes `HOLD_S`: `record` says "holding", then "finished",
    or "cancelled" when its stop cancelled the work first."""

    name: ClassVar[str] = "rollout"
    kinds: ClassVar[tuple[type[ev.Event], ...]] = (ev.TaskScheduled,)
    shared: ClassVar[bool] = True

    def __init__(self, record: Path) -> None:
        self.record = record

    async def handle(self, event: ev.Event) -> None:
        self.record.write_text("holding")
        try:
            await asyncio.sleep(HOLD_S)
        except asyncio.CancelledError:
            self.record.write_text("cancelled")
            raise
        self.record.write_text("finished")


@contextlib.asynccontextmanager
async def holding_rollout(recipe: Recipe, env: ActorEnv, index: int) -> AsyncIterator[list[Actor]]:
    yield [HoldingRollout(Path(env.run_dir) / HELD)]

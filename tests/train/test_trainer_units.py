"""The trainer's readiness and batch queries bind against the real views for every algorithm
(an empty log and a populated one), so a renamed view column fails here, not in a run."""

from __future__ import annotations

import pytest

from stacx import events as ev
from stacx.train.config import ALGORITHMS, TrainerConfig
from stacx.train.units import batch_rows_sql, pending_step_sql, ready_units_sql, trainer_state_sql

from .conftest import Log


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_queries_bind_for_every_algorithm(log: Log, algorithm: str) -> None:
    cfg = TrainerConfig(algorithm=algorithm, mode="async", max_staleness=2)
    for sql in (
        ready_units_sql(cfg, 3),
        batch_rows_sql(cfg, ["e'1"]),
        trainer_state_sql(),
        pending_step_sql(3),
    ):
        log.rows(sql)  # raises on a binder error


def test_sft_units_are_scored_episodes_passing_the_filter(log: Log) -> None:
    run = "r"
    events: list[ev.Event] = []
    for i, (actor, reward) in enumerate([("oracle", 1.0), ("oracle", 0.0), ("student", 1.0)]):
        e = f"e{i}"
        events += [
            ev.EpisodeStarted(run_id=run, episode_id=e, task_id="t", group_id=f"g{i}"),
            ev.TurnGenerated(
                run_id=run, episode_id=e, turn=0, prompt_ids=[1, 2], output_ids=[3], actor=actor
            ),
            ev.EpisodeFinished(run_id=run, episode_id=e, stop_reason="submitted"),
            ev.RewardAssigned(run_id=run, episode_id=e, reward=reward),
        ]
    events.append(
        ev.TrainStepFinished(
            run_id=run, step=1, algorithm="sft", loss=0.0, weight_version=1, episode_ids=["e2"]
        )
    )
    log.write(*events)
    cfg = TrainerConfig(algorithm="sft")  # default filter: reward >= 1
    assert [r["unit_id"] for r in log.rows(ready_units_sql(cfg, 1))] == ["e0"]  # e2 was trained
    assert [r["unit_id"] for r in log.rows(ready_units_sql(cfg, 0))] == ["e0", "e2"]  # uncommitted
    only_oracle = TrainerConfig(algorithm="sft", filter="actor = 'oracle'")
    assert [r["unit_id"] for r in log.rows(ready_units_sql(only_oracle, 0))] == ["e0", "e1"]

"""The trainer's readiness and batch queries, against the real views: they bind for every
algorithm, and a unit is ready only when every signal it waits for is in the log (the DAgger,
OPD and AggreVaTe races: a step on a half-labeled unit would exclude the rest for good)."""

from __future__ import annotations

import pytest

from stacx import events as ev
from stacx.train import units
from stacx.train.algorithms import TRAINED as ALGORITHMS
from stacx.train.config import TrainerConfig
from stacx.train.units import (
    batch_rows_sql,
    gate_sql,
    pending_sql,
    ready_units_sql,
    redo_steps_sql,
    trainer_state_sql,
    waiting_sql,
)

from .conftest import Log

RUN = "r"


def _ready(log: Log, cfg: TrainerConfig, version: int = 0) -> list[str]:
    sql = ready_units_sql(cfg)
    return [str(r["unit_id"]) for r in log.rows(sql, units.params(cfg, sql, version))]


def _one(log: Log, cfg: TrainerConfig, sql: str, version: int = 0) -> object:
    (row,) = log.rows(sql, units.params(cfg, sql, version))
    return next(iter(row.values()))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_queries_bind_for_every_algorithm(log: Log, algorithm: str, mode: str) -> None:
    cfg = TrainerConfig(algorithm=algorithm, mode=mode, max_staleness=2 if mode == "async" else 0)
    sqls = [ready_units_sql(cfg), trainer_state_sql(), pending_sql(cfg)]
    sqls += [waiting_sql(cfg), *([g] if (g := gate_sql(cfg)) else [])]
    for sql in sqls:
        log.rows(sql, units.params(cfg, sql, 3))  # raises on a binder error
    log.rows(redo_steps_sql(), {"durable": 1, "published": 3})
    log.rows(batch_rows_sql(cfg), {"episode_ids": ["e'1"]})


def _episode(
    e: str,
    *,
    group: str,
    turns: list[str],
    reward: float | None,
    iteration: int = 0,
    policy: str = "student",
    index: int = 0,
) -> list[ev.Event]:
    out: list[ev.Event] = [
        ev.EpisodeStarted(
            run_id=RUN,
            episode_id=e,
            task_id="t",
            group_id=group,
            sample_index=index,
            policy=policy,
            iteration=iteration,
        )
    ]
    out += [
        ev.TurnGenerated(
            run_id=RUN,
            episode_id=e,
            turn=i,
            prompt_ids=[1, 2],
            output_ids=[3],
            logprobs=[-0.5],
            actor=a,
            weight_version=0,
        )
        for i, a in enumerate(turns)
    ]
    out.append(ev.EpisodeFinished(run_id=RUN, episode_id=e, stop_reason="max_turns"))
    if reward is not None:
        out.append(ev.RewardAssigned(run_id=RUN, episode_id=e, reward=reward))
    return out


def _label(e: str, turn: int) -> ev.TeacherLabeled:
    return ev.TeacherLabeled(run_id=RUN, episode_id=e, turn=turn, prompt_ids=[1, 2], label_ids=[4])


def _scheduled(group: str, n: int, iteration: int = 0) -> ev.TaskScheduled:
    return ev.TaskScheduled(
        run_id=RUN, task_id="t", task_path="/t", group_id=group, n_samples=n, iteration=iteration
    )


def test_sft_units_are_scored_episodes_passing_the_filter_new_ones_first(log: Log) -> None:
    events: list[ev.Event] = []
    for i, (actor, reward) in enumerate([("oracle", 1.0), ("oracle", 0.0), ("student", 1.0)]):
        events += _episode(f"e{i}", group=f"g{i}", turns=[actor], reward=reward)
    events.append(
        ev.TrainStepFinished(
            run_id=RUN, step=1, algorithm="sft", loss=0.0, weight_version=1, episode_ids=["e2"]
        )
    )
    log.write(*events)
    cfg = TrainerConfig(algorithm="sft")  # default filter: reward >= 1
    # the aggregate: e2 was trained on (version 1), so the untrained e0 comes first
    assert _ready(log, cfg, 1) == ["e0", "e2"]
    assert _ready(log, cfg, 0) == ["e0", "e2"]  # step 1 not committed at version 0: by time
    only_oracle = TrainerConfig(algorithm="sft", filter="actor = 'oracle'")
    assert _ready(log, only_oracle, 0) == ["e0", "e1"]


def test_dagger_episode_waits_for_every_label(log: Log) -> None:
    cfg = TrainerConfig(algorithm="dagger", batch_episodes=2)
    log.write(_scheduled("g", 2))
    log.write(*_episode("a", group="g", turns=["student", "teacher"], reward=0.0))
    log.write(*_episode("b", group="g", turns=["student"], reward=1.0, index=1))
    log.write(_label("a", 0), _label("b", 0))
    # `a` has one of its two labels: not ready, and the iteration is not settled
    assert _ready(log, cfg) == ["b"]
    assert _one(log, cfg, waiting_sql(cfg)) == 1
    assert _one(log, cfg, gate_sql(cfg) or "") is False
    log.write(_label("a", 1))
    assert sorted(_ready(log, cfg)) == ["a", "b"]
    assert _one(log, cfg, gate_sql(cfg) or "") is True


def test_dagger_label_failure_ends_the_wait_without_failing_the_episode(log: Log) -> None:
    cfg = TrainerConfig(algorithm="dagger", batch_episodes=1)
    log.write(_scheduled("g", 1))
    log.write(*_episode("a", group="g", turns=["student", "student"], reward=0.0), _label("a", 0))
    assert _ready(log, cfg) == []
    log.write(ev.InfraFailed(run_id=RUN, failure_kind="engine", episode_id="a", turn=1))
    assert _ready(log, cfg) == ["a"]
    assert log.rows("select status from episodes") == [{"status": "scored"}]
    assert log.rows("select done, failed from samples") == [{"done": True, "failed": False}]


def test_gate_waits_for_the_iteration_to_be_scheduled_and_every_sample(log: Log) -> None:
    cfg = TrainerConfig(algorithm="dagger", batch_episodes=1, steps_per_iteration=2)
    gate = gate_sql(cfg) or ""
    assert _one(log, cfg, gate, 0) is False  # nothing scheduled yet
    log.write(_scheduled("g", 2))
    log.write(*_episode("a", group="g", turns=["student"], reward=1.0), _label("a", 0))
    assert _one(log, cfg, gate, 0) is False  # one of two samples
    log.write(*_episode("b", group="g", turns=["student"], reward=1.0, index=1), _label("b", 0))
    assert _one(log, cfg, gate, 0) is True
    assert _one(log, cfg, gate, 1) is True  # steps 1 and 2 both belong to iteration 0
    assert _one(log, cfg, gate, 2) is False  # step 3: iteration 1, not scheduled


def test_opd_episode_waits_for_every_student_score(log: Log) -> None:
    cfg = TrainerConfig(algorithm="opd", filter="true")
    log.write(_scheduled("g", 1))
    log.write(*_episode("a", group="g", turns=["student", "student"], reward=1.0))
    log.write(ev.TeacherScored(run_id=RUN, episode_id="a", turn=0, teacher_logprobs=[-1.0]))
    assert _ready(log, cfg) == []
    log.write(ev.TeacherScored(run_id=RUN, episode_id="a", turn=1, teacher_logprobs=[-1.0]))
    assert _ready(log, cfg) == ["a"]


def test_aggrevate_parent_waits_for_all_k_branches(log: Log) -> None:
    cfg = TrainerConfig(algorithm="aggrevate", branches=2)
    log.write(_scheduled("g", 1))
    log.write(*_episode("p", group="g", turns=["student", "student"], reward=0.0))
    for k in range(2):
        log.write(
            ev.BranchCreated(
                run_id=RUN,
                branch_id=f"b{k}",
                parent_episode_id="p",
                turn=1,
                action_index=k,
                episode_id=f"pb{k}",
            ),
            *_episode(
                f"pb{k}", group=f"gb{k}", turns=["student", "student"], reward=1.0, policy="branch"
            ),
        )
    log.write(
        ev.CostToGoEstimated(
            run_id=RUN,
            branch_id="b0",
            parent_episode_id="p",
            turn=1,
            action_index=0,
            cost=0.0,
            reward=1.0,
        )
    )
    assert _ready(log, cfg) == []
    assert _one(log, cfg, waiting_sql(cfg)) == 1
    log.write(ev.InfraFailed(run_id=RUN, failure_kind="non_determinism", episode_id="pb1"))
    assert _ready(log, cfg) == ["p"]
    assert _one(log, cfg, waiting_sql(cfg)) == 0


def test_grpo_group_waits_for_every_scheduled_sample(log: Log) -> None:
    cfg = TrainerConfig(algorithm="grpo", batch_groups=1)
    log.write(_scheduled("g", 2))
    log.write(*_episode("a", group="g", turns=["student"], reward=1.0))
    assert _ready(log, cfg) == []
    log.write(*_episode("b", group="g", turns=["student"], reward=0.0, index=1))
    assert _ready(log, cfg) == ["g"]
    log.write(
        ev.TrainStepFinished(
            run_id=RUN, step=1, algorithm="grpo", loss=0.0, weight_version=1, episode_ids=["a", "b"]
        )
    )
    assert _ready(log, cfg, 1) == []  # used once


def test_sync_step_waits_for_the_eval_pinned_to_its_version(log: Log) -> None:
    """Sync mode: the step after v waits for the periodic eval of v (else the engine would load
    v+1 mid-eval and score part of "v" on v+1); async mode does not wait."""
    cfg = TrainerConfig(algorithm="grpo")
    gate = gate_sql(cfg) or ""
    assert _one(log, cfg, gate, 0) is True  # no eval scheduled: nothing to wait for
    scheduled = ev.TaskScheduled(
        run_id=RUN,
        task_id="t",
        task_path="/t",
        group_id="ev0",
        n_samples=2,
        role="eval",
        split="eval",
        weight_version=0,
    )
    log.write(scheduled)
    log.write(*_episode("a", group="ev0", turns=["student"], reward=1.0))
    assert _one(log, cfg, gate, 0) is False  # one of the eval's two samples is done
    assert _one(log, cfg, gate, 1) is False  # and an older version's eval still gates
    log.write(*_episode("b", group="ev0", turns=["student"], reward=0.0, index=1))
    assert _one(log, cfg, gate, 0) is True
    assert gate_sql(TrainerConfig(algorithm="grpo", mode="async", max_staleness=1)) is None

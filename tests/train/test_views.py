"""The training, imitation and lineage views (events/views/2*.sql) on a hand-built log in a real
DuckDB file, with every table created from the catalog and every view loaded as on open."""

from __future__ import annotations

import pytest
import torch

from stacx.events import (
    BranchCreated,
    CostToGoEstimated,
    EpisodeFinished,
    EpisodeStarted,
    EventImported,
    InfraFailed,
    RewardAssigned,
    TaskScheduled,
    TeacherLabeled,
    TeacherScored,
    TrainStepFinished,
    TurnGenerated,
    WeightsLoaded,
    WeightsPublished,
)
from tests.train.oracles import group_advantages, group_index

from .conftest import Log

RUN = "run-a"
VIEWS = [
    "sft_examples",
    "grpo_batch",
    "train_steps",
    "weights",
    "dagger_dataset",
    "aggrevate_dataset",
    "opd_batch",
    "reward_by_weight_version",
    "lineage",
]


def episode(
    log: Log,
    eid: str,
    group: str,
    reward: float | None,
    *,
    task: str = "t",
    turns: int = 1,
    version: int = 0,
    failed: bool = False,
    iteration: int = 0,
    actor: str = "student",
) -> None:
    log.write(
        EpisodeStarted(
            run_id=RUN, episode_id=eid, task_id=task, group_id=group, iteration=iteration
        )
    )
    for k in range(turns):
        prompt = [1, 2, 3 + k]
        out = [10 + k, 11 + k]
        log.write(
            TurnGenerated(
                run_id=RUN,
                episode_id=eid,
                turn=k,
                prompt_ids=prompt,
                output_ids=out,
                logprobs=[-0.5, -0.25],
                weight_version=version,
                actor=actor,
            )
        )
    if failed:
        log.write(InfraFailed(run_id=RUN, failure_kind="oom", episode_id=eid))
        return
    log.write(EpisodeFinished(run_id=RUN, episode_id=eid, stop_reason="submitted", n_turns=turns))
    if reward is not None:
        log.write(RewardAssigned(run_id=RUN, episode_id=eid, reward=reward))


def test_every_view_loads_and_is_empty_on_an_empty_log(log: Log) -> None:
    for view in VIEWS:
        assert log.rows(f"select count(*) as n from {view}") == [{"n": 0}], view
    assert log.rows("select max(version) as v from weights") == [{"v": None}]


def test_sft_examples_train_the_completion_filterable_by_reward(log: Log) -> None:
    episode(log, "e1", "g", 1.0, turns=2)
    episode(log, "e2", "g", 0.0)
    episode(log, "e3", "g", None, failed=True)
    rows = log.rows("select * from sft_examples where reward > 0 order by turn")
    assert [(r["episode_id"], r["turn"]) for r in rows] == [("e1", 0), ("e1", 1)]
    assert rows[1]["prompt_ids"] == [1, 2, 4]
    assert rows[1]["completion_ids"] == [11, 12]
    assert rows[1]["loss_mask"] == [1, 1]  # one per completion id: the prompt is never trained
    assert rows[0]["task_id"] == "t" and rows[0]["actor"] == "student"
    failed = log.rows("select reward, status from sft_examples where episode_id = 'e3'")
    assert failed == [{"reward": None, "status": "failed"}]


def test_grpo_batch_advantages_equal_the_python_ones_and_skip_infra_failures(log: Log) -> None:
    rewards = {"a1": 1.0, "a2": 0.0, "a3": 0.5, "b1": 0.1, "b2": 0.1, "b3": 0.1, "c1": 1.0}
    for eid, r in rewards.items():
        episode(log, eid, eid[0], r, turns=2 if eid == "a1" else 1)
    episode(log, "a4", "a", None, failed=True)  # must not enter group a as a 0
    episode(log, "a5", "a", 1.0, actor="teacher")  # teacher turns are not GRPO samples
    rewards["a5"] = 1.0
    rows = log.rows("select * from grpo_batch order by episode_id, turn")
    assert "a4" not in {r["episode_id"] for r in rows}
    assert "a5" not in {r["episode_id"] for r in rows}  # its turn is a teacher's

    ids = sorted(rewards)
    r_N = torch.tensor([rewards[e] for e in ids], dtype=torch.float64)
    g_N = group_index([e[0] for e in ids])
    plain = dict(zip(ids, group_advantages(r_N, g_N, normalize_std=False).tolist(), strict=True))
    std = dict(zip(ids, group_advantages(r_N, g_N, normalize_std=True).tolist(), strict=True))
    for row in rows:
        eid = str(row["episode_id"])
        assert row["advantage"] == pytest.approx(plain[eid], abs=1e-12), eid
        assert row["advantage_std"] == pytest.approx(std[eid], abs=1e-9), eid
    by_id = {r["episode_id"]: r for r in rows}
    assert by_id["b1"]["advantage"] == 0.0 and by_id["b1"]["advantage_std"] == 0.0  # all equal
    assert by_id["c1"]["advantage_std"] == 0.0  # group of one
    assert by_id["a2"]["group_size"] == 4 and by_id["a2"]["group_failed"] == 1
    assert by_id["a2"]["behavior_logprobs"] == [-0.5, -0.25]


def test_grpo_batch_staleness_is_latest_published_minus_turn_version(log: Log) -> None:
    episode(log, "old", "g", 1.0, version=0)
    assert log.rows("select staleness from grpo_batch") == [{"staleness": 0}]  # nothing published
    log.write(
        WeightsPublished(run_id=RUN, version=1, path="p1", sha256="s1", step=1),
        WeightsPublished(run_id=RUN, version=2, path="p2", sha256="s2", step=2),
    )
    episode(log, "new", "g", 0.0, version=2)
    staleness = "select episode_id, staleness from grpo_batch order by episode_id"
    assert log.rows(staleness) == [
        {"episode_id": "new", "staleness": 0},
        {"episode_id": "old", "staleness": 2},
    ]
    log.write(WeightsPublished(run_id=RUN, version=3, path="p3", sha256="s3", step=3))
    assert log.rows(staleness) == [
        {"episode_id": "new", "staleness": 1},
        {"episode_id": "old", "staleness": 3},
    ]


def test_train_steps_and_weights(log: Log) -> None:
    log.write(
        TrainStepFinished(
            run_id=RUN,
            step=1,
            algorithm="grpo",
            loss=0.5,
            weight_version=1,
            n_tokens=100,
            duration_ms=12.0,
            reward_mean=0.25,
            episode_ids=["e1", "e2"],
        ),
        TrainStepFinished(
            run_id=RUN, step=2, algorithm="grpo", loss=0.25, weight_version=2, n_tokens=90
        ),
        WeightsPublished(run_id=RUN, version=1, path="/w/1", sha256="a", step=1),
        WeightsPublished(run_id=RUN, version=2, path="/w/2", sha256="b", step=2),
        WeightsLoaded(run_id=RUN, version=1, engine="torch", latency_ms=30.0),
        WeightsLoaded(run_id=RUN, version=1, engine="sglang", latency_ms=80.0),
    )
    steps = log.rows(
        "select step, loss, tokens, weight_version, n_episodes from train_steps order by step"
    )
    assert steps == [
        {"step": 1, "loss": 0.5, "tokens": 100, "weight_version": 1, "n_episodes": 2},
        {"step": 2, "loss": 0.25, "tokens": 90, "weight_version": 2, "n_episodes": 0},
    ]
    assert log.rows("select max(version) as v from weights") == [{"v": 2}]
    rows = log.rows(
        "select version, engine, load_latency_ms, path from weights order by version, engine"
    )
    assert rows == [
        {"version": 1, "engine": "sglang", "load_latency_ms": 80.0, "path": "/w/1"},
        {"version": 1, "engine": "torch", "load_latency_ms": 30.0, "path": "/w/1"},
        {"version": 2, "engine": None, "load_latency_ms": None, "path": "/w/2"},
    ]


def test_dagger_dataset_is_the_union_of_all_iterations_labels(log: Log) -> None:
    episode(log, "s0", "g0", 0.0, turns=2, iteration=0)
    for k in range(2):
        log.write(
            TeacherLabeled(
                run_id=RUN,
                episode_id="s0",
                turn=k,
                prompt_ids=[1, 2, 3 + k],
                label_ids=[7, 8, 9],
                iteration=0,
                teacher="T",
            )
        )
    assert log.rows("select count(*) as n from dagger_dataset") == [{"n": 2}]
    episode(log, "s1", "g1", 1.0, turns=1, iteration=1)
    log.write(
        TeacherLabeled(
            run_id=RUN,
            episode_id="s1",
            turn=0,
            prompt_ids=[1, 2, 3],
            label_ids=[7],
            iteration=1,
            teacher="T",
        )
    )
    rows = log.rows("select * from dagger_dataset order by iteration, episode_id, turn")
    assert [r["iteration"] for r in rows] == [0, 0, 1]  # earlier iterations' labels stay
    assert rows[1]["completion_ids"] == [7, 8, 9]
    assert rows[1]["student_output_ids"] == [11, 12]  # the executed action, not the label
    assert rows[1]["loss_mask"] == [1, 1, 1]  # one per label id
    assert all(r["prompt_matches"] for r in rows)


def test_aggrevate_dataset_advantage_is_negative_centered_cost(log: Log) -> None:
    episode(log, "parent", "g", 0.0, turns=1)
    costs = {("b0", 0): 0.0, ("b1", 1): 1.0, ("b2", 2): 1.0}
    for (bid, k), cost in costs.items():
        episode(log, f"ep-{bid}", f"gb-{bid}", 1 - cost, turns=3)
        log.write(
            BranchCreated(
                run_id=RUN,
                branch_id=bid,
                parent_episode_id="parent",
                turn=2,
                action_index=k,
                episode_id=f"ep-{bid}",
            ),
            CostToGoEstimated(
                run_id=RUN,
                branch_id=bid,
                parent_episode_id="parent",
                turn=2,
                action_index=k,
                cost=cost,
                reward=1 - cost,
            ),
        )
    # a second state with equal costs
    log.write(
        CostToGoEstimated(
            run_id=RUN,
            branch_id="c0",
            parent_episode_id="parent",
            turn=1,
            action_index=0,
            cost=0.5,
            reward=0.5,
        )
    )
    log.write(
        CostToGoEstimated(
            run_id=RUN,
            branch_id="c1",
            parent_episode_id="parent",
            turn=1,
            action_index=1,
            cost=0.5,
            reward=0.5,
        )
    )
    rows = log.rows("select * from aggrevate_dataset order by turn, action_index")
    assert [r["advantage"] for r in rows[:2]] == [0.0, 0.0]
    adv = [r["advantage"] for r in rows[2:]]
    assert adv == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    assert rows[2]["action_ids"] == [12, 13]  # the branch episode's exploration turn (turn 2)
    assert rows[2]["n_actions"] == 3 and rows[2]["q"] == 0.0


def test_opd_batch_per_token_advantage_is_teacher_minus_student(log: Log) -> None:
    episode(log, "s", "g", 1.0, turns=2)
    log.write(
        TeacherScored(
            run_id=RUN, episode_id="s", turn=0, teacher_logprobs=[-0.1, -1.0], teacher="T"
        ),
        TeacherScored(run_id=RUN, episode_id="s", turn=1, teacher_logprobs=[-0.1], teacher="T"),
    )
    rows = log.rows("select * from opd_batch order by turn")
    assert rows[0]["advantages"] == pytest.approx([0.4, -0.75])
    assert rows[0]["loss_mask"] == [1, 1] and rows[0]["aligned"]
    assert rows[1]["aligned"] is False and rows[1]["advantages"] is None
    assert rows[0]["grpo_advantage"] == 0.0  # a group of one


def test_opd_discount_and_grpo_weight_recompute_the_views_advantages(log: Log) -> None:
    from stacx.train.algorithms.opd import opd_advantage_lists

    episode(log, "s", "g", 1.0, turns=2)
    episode(log, "u", "g", 0.0, turns=1)
    log.write(
        TeacherScored(
            run_id=RUN, episode_id="s", turn=0, teacher_logprobs=[-0.1, -1.0], teacher="T"
        ),
        TeacherScored(run_id=RUN, episode_id="s", turn=1, teacher_logprobs=[-0.1], teacher="T"),
    )
    table = log.con.sql("select * from opd_batch order by episode_id, turn").to_arrow_table()
    # every knob off: the trainer trains on the view's column itself (one definition)
    assert opd_advantage_lists(table) is table
    view = table.column("advantages").to_pylist()
    assert view[0] == pytest.approx([0.4, -0.75]) and view[1] is None
    got = opd_advantage_lists(table, discount=1.0).column("advantages").to_pylist()
    assert got[0] == pytest.approx([0.4 - 0.75, -0.75]) and got[1] is None  # not aligned
    grpo = table.column("grpo_advantage").to_pylist()[0]
    assert grpo == pytest.approx(0.5)  # reward 1 minus the mean of group g (1 and 0)
    got = opd_advantage_lists(table, grpo_weight=0.5).column("advantages").to_pylist()
    assert got[0] == pytest.approx([0.4 + 0.5 * grpo, -0.75 + 0.5 * grpo])
    got = opd_advantage_lists(table, center=True).column("advantages").to_pylist()
    assert got[0] == pytest.approx([0.4 + 0.175, -0.75 + 0.175])  # mean of 0.4 and -0.75 removed
    assert got[1] is None


def test_reward_by_weight_version_counts_failures_apart(log: Log) -> None:
    log.write(TaskScheduled(run_id=RUN, task_id="t", task_path="p", group_id="g0", split="eval"))
    episode(log, "v0a", "g0", 0.0, version=0)
    episode(log, "v0b", "g0", 1.0, version=0)
    episode(log, "v0c", "g0", None, version=0, failed=True)
    episode(log, "v1a", "g1", 1.0, version=1)
    episode(log, "v1b", "g1", 0.5, version=1)
    rows = log.rows("select * from reward_by_weight_version order by weight_version")
    assert [(r["weight_version"], r["split"]) for r in rows] == [(0, "eval"), (1, "train")]
    assert rows[0]["n_episodes"] == 2 and rows[0]["n_infra_failed"] == 1
    assert rows[0]["reward_mean"] == 0.5 and rows[0]["pass_rate"] == 0.5
    assert rows[1]["reward_mean"] == 0.75 and rows[1]["pass_rate"] == 0.5


def test_lineage_lists_trained_episodes_and_their_source_run(log: Log) -> None:
    episode(log, "local", "g", 1.0, task="t1", version=0)
    start = EpisodeStarted(run_id=RUN, episode_id="replayed", task_id="t2", group_id="g")
    log.write(
        start,
        EventImported(
            run_id=RUN,
            imported_event_id=start.event_id,
            source_run_id="run-old",
            source_event_id="x",
        ),
    )
    log.write(
        TrainStepFinished(
            run_id=RUN,
            step=1,
            algorithm="sft",
            loss=1.0,
            weight_version=1,
            episode_ids=["local", "replayed"],
        ),
        TrainStepFinished(
            run_id=RUN, step=2, algorithm="sft", loss=1.0, weight_version=2, episode_ids=["local"]
        ),
    )
    rows = log.rows(
        "select weight_version, episode_id, task_id, imported, source_run_id from lineage order by weight_version, episode_id"
    )
    assert rows == [
        {
            "weight_version": 1,
            "episode_id": "local",
            "task_id": "t1",
            "imported": False,
            "source_run_id": RUN,
        },
        {
            "weight_version": 1,
            "episode_id": "replayed",
            "task_id": "t2",
            "imported": True,
            "source_run_id": "run-old",
        },
        {
            "weight_version": 2,
            "episode_id": "local",
            "task_id": "t1",
            "imported": False,
            "source_run_id": RUN,
        },
    ]

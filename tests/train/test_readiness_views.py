"""The named readiness views (events/views/00_episodes.sql, 02_samples.sql) that the scheduler,
the trainer's readiness and the rollout manager select from: `tasks_lost`, `scheduled_groups`
(which group is an eval group) and `attempts` (per-attempt state), over a real DuckDB log."""

from __future__ import annotations

from stacx.events import InfraFailed, TaskScheduled
from stacx.schedule.scheduler import STATE_SQL

from .conftest import Log
from .test_views import RUN, episode


def schedule(log: Log, group: str, task: str, **fields: object) -> None:
    log.write(
        TaskScheduled(
            run_id=RUN,
            task_id=task,
            task_path="/x",
            group_id=group,
            n_samples=2,
            **fields,  # type: ignore[arg-type]
        )
    )


def test_an_eval_group_is_a_periodic_eval_not_an_eval_runs_group(log: Log) -> None:
    """The one definition: TaskScheduled.role = 'eval' (a periodic eval of a weight version).
    An eval run's groups (split 'eval') are not eval groups: an oracle's demonstrations of an
    eval run are SFT data; every view and the scheduler agree."""
    schedule(log, "train", "t1")
    schedule(log, "periodic", "t2", split="eval", role="eval", weight_version=3, iteration=3)
    schedule(log, "eval-run", "t3", split="eval")
    for group, eid in (("train", "a"), ("periodic", "b"), ("eval-run", "c")):
        episode(log, eid, group, 1.0)
    got = log.rows("select group_id, is_eval from scheduled_groups order by group_id")
    assert got == [
        {"group_id": "eval-run", "is_eval": False},
        {"group_id": "periodic", "is_eval": True},
        {"group_id": "train", "is_eval": False},
    ]
    roles = log.rows("select episode_id, role, split from episodes order by episode_id")
    assert [(r["role"], r["split"]) for r in roles] == [
        ("train", "train"),
        ("eval", "eval"),
        ("train", "eval"),
    ]
    for view in ("sft_examples", "grpo_batch"):
        rows = log.rows(f"select distinct episode_id from {view} order by 1")
        assert [r["episode_id"] for r in rows] == ["a", "c"], view
    assert log.rows("select weight_version, n_samples from eval_curve") == [
        {"weight_version": 3, "n_samples": 1}
    ]
    state = log.rows(STATE_SQL)[0]
    # the periodic eval is no rollout iteration and its missing sample is pending
    assert state["iterations"] == 1 and state["eval_pending"] == 1
    assert state["evals_scheduled"] == [3]


def test_a_task_lost_for_good_is_one_row_and_its_groups_are_not_waited_for(log: Log) -> None:
    schedule(log, "g1", "broken")
    schedule(log, "g2", "broken", iteration=1)
    schedule(log, "g3", "ok")
    log.write(
        InfraFailed(run_id=RUN, failure_kind="task_invalid", task_id="broken", will_retry=True)
    )
    assert log.rows("select * from tasks_lost") == []  # a retry is coming: not lost
    for _ in range(2):  # recorded twice (a redelivery): still one lost task
        log.write(
            InfraFailed(run_id=RUN, failure_kind="task_invalid", task_id="broken", will_retry=False)
        )
    assert log.rows("select * from tasks_lost") == [{"task_id": "broken"}]
    lost = log.rows("select group_id, lost from scheduled_groups order by group_id")
    assert [r["lost"] for r in lost] == [True, True, False]
    assert log.rows(STATE_SQL)[0]["groups_lost"] == 1


def test_attempts_say_scored_failed_and_final_per_attempt(log: Log) -> None:
    schedule(log, "g", "t")
    episode(log, "a0", "g", None)
    log.write(InfraFailed(run_id=RUN, failure_kind="oom", episode_id="a0", will_retry=True))
    episode(log, "a1", "g", 0.5)
    episode(log, "b0", "g", None)  # finished, not scored yet: neither
    episode(log, "c0", "g", None, failed=True)  # will_retry false: failed for good
    log.write(InfraFailed(run_id=RUN, failure_kind="engine", episode_id="b0", turn=0))
    rows = log.rows("select episode_id, scored, failed, final from attempts order by episode_id")
    assert [(r["episode_id"], r["scored"], r["failed"], r["final"]) for r in rows] == [
        ("a0", False, True, False),
        ("a1", True, False, False),
        ("b0", False, False, False),  # a teacher's failure on one turn is not the attempt's
        ("c0", False, True, True),
    ]

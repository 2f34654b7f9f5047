"""Periodic eval during training (the recipe's [eval]): the scheduler's pure rules, the recipe's
checks, and one real run (GRPO on the math tasks, process sandboxes, the bundled model) whose
eval episodes are in the same log with role 'eval', pinned to their versions, never trained on,
and shown by `eval_curve` and `stacx plot`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from stacx.errors import ConfigError
from stacx.launch.loader import convert
from stacx.schedule.scheduler import (
    EvalPlan,
    LogState,
    Plan,
    TaskRef,
    eval_events,
    eval_versions,
    evals_due,
    verdict,
)
from stacx.store import db

ROOT = Path(__file__).resolve().parents[2]
TASKS = [TaskRef("a", "/t/a"), TaskRef("b", "/t/b")]


def state(version: int, **kw: object) -> LogState:
    base = dict(
        scheduled=frozenset(),
        iterations=version + 1,
        version=version,
        samples_done=0,
        samples_scheduled=0,
        groups_lost=0,
    )
    return LogState(**{**base, **kw})  # type: ignore[arg-type]


def test_versions_evaluated_are_every_nth_the_start_and_the_last() -> None:
    assert eval_versions(2, 5) == [0, 2, 4, 5]
    assert eval_versions(2, 4, at_start=False) == [2, 4]
    assert eval_versions(10, 3) == [0, 3]


def test_an_eval_is_due_once_its_version_is_published_and_is_pinned_to_it() -> None:
    plan = Plan(
        tasks=TASKS,
        per_iteration=1,
        group_size=2,
        steps=4,
        evals=EvalPlan(tasks=TASKS, samples=3, versions=[0, 2, 4]),
    )
    assert evals_due(plan, state(0)) == [0]
    assert evals_due(plan, state(3)) == [0, 2]
    events = eval_events("run", plan.evals, 2)  # type: ignore[arg-type]
    assert [(e.role, e.split, e.weight_version, e.n_samples) for e in events] == [
        ("eval", "eval", 2, 3)
    ] * 2
    # deterministic ids, distinct from the training iterations' and across versions
    assert [e.event_id for e in events] == [e.event_id for e in eval_events("run", plan.evals, 2)]  # type: ignore[arg-type]
    assert not {e.group_id for e in events} & {
        e.group_id
        for e in eval_events("run", plan.evals, 4)  # type: ignore[arg-type]
    }


def test_training_is_complete_only_once_the_last_eval_is_scored() -> None:
    plan = Plan(
        tasks=TASKS,
        per_iteration=1,
        group_size=2,
        steps=2,
        evals=EvalPlan(tasks=TASKS, versions=[0, 2]),
    )
    assert verdict(plan, state(2, evals_scheduled=frozenset({0}))) is None  # v2's not scheduled
    assert verdict(plan, state(2, evals_scheduled=frozenset({0, 2}), eval_pending=1)) is None
    assert verdict(plan, state(2, evals_scheduled=frozenset({0, 2}))) == "completed"
    assert verdict(msgspec.structs.replace(plan, evals=None), state(2)) == "completed"


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"every": 1, "samplez": 2}, "samplez"),
        ({"samples": 2}, "set eval.every"),
        ({"every": -1}, "every >= 0"),
    ],
)
def test_bad_eval_sections_fail_at_load(section: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        convert({"name": "x", "eval": section}, source="test")


def test_imitation_roll_ins_and_eval_runs_refuse_a_periodic_eval() -> None:
    with pytest.raises(ConfigError, match="roll-in"):
        convert(
            {
                "name": "x",
                "algorithm": {"name": "dagger"},
                "teacher": {"path": "t"},
                "eval": {"every": 1},
            },
            source="test",
        )
    with pytest.raises(ConfigError, match="for training runs"):
        convert({"name": "x", "algorithm": {"name": "eval"}, "eval": {"every": 1}}, source="t")


@pytest.mark.model
def test_a_training_run_records_its_eval_curve(tmp_path: Path) -> None:
    sets = [
        "trainer.steps=1",
        "tasks.per_iteration=1",
        "tasks.group_size=2",
        "agent.max_turns=1",
        "agent.max_new_tokens=24",
        r"trainer.trainable='^model\.norm\.weight$'",
        "eval.every=1",
        "eval.samples=1",
        "eval.include=['heldout-*']",
        "eval.limit=2",
        "logging.progress='plain'",
    ]
    run_dir = tmp_path / "r"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stacx",
            "run",
            str(ROOT / "recipes/retool/grpo_tiny.toml"),
            "--run-dir",
            str(run_dir),
            "--quiet",
            *[a for s in sets for a in ("--set", s)],
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    con = db.connect_run(run_dir)
    curve = con.execute("select weight_version, n_samples, n_pending from eval_curve").fetchall()
    assert curve == [(0, 2, 0), (1, 2, 0)]
    # error bars: the binomial standard error of each pass rate; off-version samples counted
    for p, n, se, off in con.execute(
        "select pass_rate, n_samples, pass_rate_se, n_off_version from eval_curve"
    ).fetchall():
        assert se == pytest.approx((p * (1 - p) / n) ** 0.5)
        assert off == 0  # sync mode: the step after v waits for v's eval (units.gate_sql)
    # the brief's own question, over the episodes view
    by_version = con.execute(
        "select weight_version, count(*) from episodes where role = 'eval' group by 1 order by 1"
    ).fetchall()
    assert by_version == [(0, 2), (1, 2)]
    evals = {
        r[0] for r in con.execute("select episode_id from episodes where role = 'eval'").fetchall()
    }
    ((trained,),) = con.execute("select episode_ids from train_step_finished").fetchall()
    assert trained and not evals & set(trained)  # never trained on
    tasks = {
        r[0] for r in con.execute("select task_id from episodes where role = 'eval'").fetchall()
    }
    assert tasks and all(t.startswith("heldout-") for t in tasks)
    assert (run_dir / "curves.png").stat().st_size > 0

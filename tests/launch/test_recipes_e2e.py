"""Every tiny recipe through the front door: `stacx run recipes/.../<algo>_tiny.toml` with the
bundled model, Docker sandboxes, the real rollout manager, teacher and trainer, at the smallest
settings that still exercise its path (one task, a small group, short replies, only the final
norm trained). GRPO's tiny recipe runs in test_real.py and test_crash.py.

Each test asserts the property that recipe exists for, from the run's log:

- sft: the step trains on the oracle's scored demonstrations, and only on those;
- dagger: the step trains on every label its iteration recorded (the readiness race: a step
  that ran on a half-labeled episode would train on fewer samples than `teacher_labeled` has);
- opd: on every teacher-scored student turn;
- aggrevate: on every explored branch of every parent it took, each parent with all k branches;
- eval (recipes/eval/swe_tiny.toml): every scheduled sample is done, nothing is trained.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from stacx.sandbox.images import bootstrap_base_image
from stacx.store import db

pytestmark = [pytest.mark.docker, pytest.mark.model, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    "tasks.include=['create-hello-file']",
    "agent.max_new_tokens=16",
    "logging.progress='plain'",
    "logging.plot=false",
    "eval={}",  # the recipes' held-out evals have their own test (test_periodic_eval.py)
]
TRAIN = [
    "tasks.per_iteration=1",
    r"trainer.trainable='^model\.norm\.weight$'",
    "trainer.max_tokens=1024",
]


def run(
    recipe: str, run_dir: Path, *overrides: str, train: bool = True
) -> duckdb.DuckDBPyConnection:
    bootstrap_base_image()
    args = [a for o in [*SMALL, *(TRAIN if train else []), *overrides] for a in ("--set", o)]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stacx",
            "run",
            str(ROOT / recipe),
            "--run-dir",
            str(run_dir),
            "--quiet",
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return db.connect_run(run_dir)


def one(con: duckdb.DuckDBPyConnection, sql: str) -> object:
    row = con.execute(sql).fetchone()
    assert row is not None
    return row[0]


def step_one(con: duckdb.DuckDBPyConnection) -> tuple[int, list[str]]:
    ((n, ids),) = con.execute(
        "select n_samples, episode_ids from train_step_finished where step = 1"
    ).fetchall()
    return int(n), [str(e) for e in ids]


def no_duplicates(con: duckdb.DuckDBPyConnection) -> None:
    assert one(con, "select count(*) - count(distinct event_id) from _events") == 0


def test_sft_trains_on_the_oracle_demonstrations(tmp_path: Path) -> None:
    con = run("recipes/swe/sft_tiny.toml", tmp_path / "r", "trainer.steps=1", "tasks.group_size=2")
    n, ids = step_one(con)
    demos = one(con, "select count(*) from sft_examples where reward >= 1")
    assert n == demos > 0
    actors = con.execute(
        f"select distinct actor from turn_generated where list_contains({ids!r}, episode_id)"
    ).fetchall()
    assert actors == [("oracle",)]
    assert one(con, "select max(version) from weights") == 1
    no_duplicates(con)


def test_dagger_step_trains_on_every_label_of_its_iteration(tmp_path: Path) -> None:
    con = run(
        "recipes/swe/dagger_tiny.toml",
        tmp_path / "r",
        "trainer.steps=1",
        "tasks.group_size=2",
        "teacher.max_new_tokens=16",
    )
    n, ids = step_one(con)
    # the step's iteration: the run may roll in part of the next one before it stops
    first = "select episode_id from episodes where iteration = 0"
    labels = one(con, f"select count(*) from teacher_labeled where episode_id in ({first})")
    assert isinstance(labels, int) and labels >= 2  # two episodes, up to two turns each
    assert n == labels
    # every visited state of the roll-ins (either actor) has its label, on the same prompt ids
    assert one(con, f"select count(*) from turn_generated where episode_id in ({first})") == labels
    assert one(con, "select bool_and(prompt_matches) from dagger_dataset") is True
    assert sorted(ids) == sorted(r[0] for r in con.execute(first).fetchall())
    no_duplicates(con)


def test_opd_step_trains_on_every_scored_student_turn(tmp_path: Path) -> None:
    con = run(
        "recipes/swe/opd_tiny.toml",
        tmp_path / "r",
        "trainer.steps=1",
        "tasks.group_size=2",
        "agent.max_turns=1",
    )
    n, _ids = step_one(con)
    scored = one(con, "select count(*) from teacher_scored")
    student_turns = one(
        con, "select count(*) from turn_generated where actor = 'student' and len(output_ids) > 0"
    )
    assert n == scored == student_turns == 2
    assert one(con, "select bool_and(aligned) from opd_batch") is True
    no_duplicates(con)


def test_aggrevate_step_waits_for_every_branch(tmp_path: Path) -> None:
    con = run(
        "recipes/swe/aggrevate_tiny.toml",
        tmp_path / "r",
        "trainer.steps=1",
        "tasks.group_size=2",
        "teacher.max_new_tokens=16",
    )
    n, ids = step_one(con)
    # the parents of iteration 0 (the one step trains on it); iteration 1, scheduled once v1 is
    # out, may have rolled in more parents before the run stopped
    rows = con.execute(
        "select parent_episode_id, count(*) from aggrevate_dataset where parent_episode_id in "
        "(select episode_id from episodes where iteration = 0) group by 1"
    ).fetchall()
    assert rows and all(k == 2 for _, k in rows)  # algorithm.imitation.branches = 2
    trained = one(
        con,
        f"select count(*) from aggrevate_dataset where list_contains({ids!r}, branch_episode_id)",
    )
    assert n == trained == 2 * len(rows)
    no_duplicates(con)


def test_eval_recipe_scores_every_sample_and_trains_nothing(tmp_path: Path) -> None:
    con = run("recipes/eval/swe_tiny.toml", tmp_path / "r", "agent.max_turns=1", train=False)
    assert one(con, "select count(*) from samples where done") == 2  # one task x group 2
    assert one(con, "select count(*) from reward_assigned") == 2
    assert one(con, "select count(*) from train_step_finished") == 0
    no_duplicates(con)

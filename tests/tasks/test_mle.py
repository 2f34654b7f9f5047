"""The bundled MLE set (recipes/tasks/mle, written by tools/make_mle.py) on the process backend,
with real sandboxes and the real verifier: the grader gives 0 to the trivial baseline, 1 to the
reference solution, 0 to no submission and a verifier failure (not a 0) to a malformed one; the
set's shape and split; the oracle through `stacx eval` with the raw metric in SQL."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from stacx.events import FailureKind
from stacx.harbor.tasks import load_task
from stacx.ports import InfraFailure
from stacx.sandbox.process_environments import ProcessEnvironments, context_copies
from stacx.store import db

ROOT = Path(__file__).resolve().parents[2]
MLE = ROOT / "recipes" / "tasks" / "mle"
IRIS = MLE / "train-iris"


def config(task: Path) -> dict:
    return json.loads((task / "tests" / "config.json").read_text())


def majority_submission(task: Path) -> str:
    """The trivial baseline's submission: the train set's majority class for every test id."""
    target = config(task)["target"]
    with (task / "environment" / "data" / "train.csv").open() as f:
        top = Counter(r[target] for r in csv.DictReader(f)).most_common(1)[0][0]
    with (task / "environment" / "data" / "test.csv").open() as f:
        ids = [r["id"] for r in csv.DictReader(f)]
    return f"id,{target}\n" + "".join(f"{i},{top}\n" for i in ids)


@pytest.mark.parametrize("which", ["baseline", "none"])
async def test_the_baseline_and_no_submission_score_zero(which: str) -> None:
    async with ProcessEnvironments(run_id="t") as envs:
        task = envs.task(str(IRIS))
        async with envs.sandbox(task, episode_id="e") as sb:
            if which == "baseline":
                await sb.write_file("/app/submission.csv", majority_submission(IRIS))
            verdict = await envs.verify(sb, task, episode_id="e")
    assert verdict.reward == 0.0
    if which == "baseline":  # the raw metric is recorded next to the normalized reward
        assert verdict.metrics["accuracy"] == pytest.approx(config(IRIS)["baseline"], abs=1e-6)
        assert verdict.metrics["submitted"] == 1.0
    else:
        assert verdict.metrics == {"submitted": 0.0}


async def test_the_reference_solution_scores_one_on_the_uploaded_data() -> None:
    async with ProcessEnvironments(run_id="t") as envs:
        task = envs.task(str(IRIS))
        async with envs.sandbox(task, episode_id="e") as sb:
            # the Dockerfile's COPY data/ /app/data/ was uploaded before the agent's turn
            assert (await sb.read_file("/app/data/train.csv")).startswith(b"id,")
            await sb.upload_dir(str(IRIS / "solution"), "/solution")
            ran = await sb.exec("bash /solution/solve.sh", timeout=120)
            assert ran.exit_code == 0, ran.stderr
            verdict = await envs.verify(sb, task, episode_id="e")
    assert verdict.reward == 1.0
    assert verdict.metrics["accuracy"] >= config(IRIS)["reference"]


@pytest.mark.parametrize(
    ("submission", "reason"),
    [
        ("id,label\n0,setosa\n", "no column ['species']"),
        ("id,species\n0,setosa\n", "ids differ"),
        ("BAD_CLASS", "'tulip' is not a class"),
    ],
)
async def test_a_malformed_submission_is_a_verifier_failure_not_a_zero(
    submission: str, reason: str
) -> None:
    if submission == "BAD_CLASS":  # a well-formed file but for one unknown class
        lines = majority_submission(IRIS).splitlines()
        lines[-1] = lines[-1].split(",")[0] + ",tulip"
        submission = "\n".join(lines) + "\n"
    async with ProcessEnvironments(run_id="t") as envs:
        task = envs.task(str(IRIS))
        async with envs.sandbox(task, episode_id="e") as sb:
            await sb.write_file("/app/submission.csv", submission)
            with pytest.raises(InfraFailure) as failure:
                await envs.verify(sb, task, episode_id="e")
    assert failure.value.kind == FailureKind.VERIFIER_NO_REWARD
    assert "submission rejected" in failure.value.message and reason in failure.value.message


def test_context_copies_follow_workdir_and_skip_what_is_not_the_context(tmp_path: Path) -> None:
    env = tmp_path / "environment"
    (env / "data").mkdir(parents=True)
    (env / "data" / "a.csv").write_text("x")
    (env / "run.sh").write_text("x")
    (env / "Dockerfile").write_text(
        "FROM python:3.11-slim\nWORKDIR /srv\nCOPY data/ data/\nCOPY --chmod=755 run.sh /bin/\n"
        "COPY --from=builder /x /y\nCOPY ../secret /z\nADD https://e.org/f /f\nCOPY *.txt /t/\n"
    )
    got = [(p.relative_to(env).as_posix(), d) for p, d in context_copies(env)]
    assert got == [("data", "/srv/data"), ("run.sh", "/bin/run.sh")]


def test_the_set_is_split_by_task_and_every_task_is_complete() -> None:
    tasks = sorted(p for p in MLE.iterdir() if p.is_dir())
    assert len(tasks) >= 24
    splits = Counter(p.name.split("-", 1)[0] for p in tasks)
    assert set(splits) == {"train", "heldout"} and splits["heldout"] >= 6
    kinds = Counter(config(p)["metric"] for p in tasks)
    assert kinds["accuracy"] >= 10 and kinds["rmse"] >= 10
    grader = (ROOT / "tools" / "mle" / "grade.py").read_text()
    for p in tasks:
        task = load_task(str(p))
        meta, cfg = task.config.metadata, config(p)
        assert meta["split"] == p.name.split("-", 1)[0] and meta["reference"] == cfg["reference"]
        assert (p / "tests" / "grade.py").read_text() == grader
        assert cfg["baseline"] != cfg["reference"] and task.has_solution
        assert [d for _, d in context_copies(task.environment_dir)] == ["/app/data"]
    size = sum(f.stat().st_size for f in MLE.rglob("*") if f.is_file())
    assert size < 6 * 2**20


def test_eval_of_the_oracle_through_the_front_door_records_the_raw_metric(tmp_path: Path) -> None:
    """`stacx eval --agent oracle --tasks mle` (the bundled set by name) on the process backend:
    each reference solution scores 1, and the raw metric sits next to the reward in SQL."""
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stacx",
            "eval",
            "--agent",
            "oracle",
            "--tasks",
            "mle",
            "--include",
            "train-iris",
            "--include",
            "heldout-boston",
            "--sandbox",
            "process",
            "--max-attempts",
            "1",
            "--run-dir",
            str(run_dir),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    con = db.connect_run(run_dir)
    rows = con.sql(
        "SELECT task_id, metric, value, reward FROM episode_metrics "
        "WHERE metric IN ('accuracy', 'rmse') ORDER BY task_id"
    ).fetchall()
    (boston, iris) = rows
    assert boston[:2] == ("heldout-boston", "rmse") and boston[3] == 1.0
    assert boston[2] <= config(MLE / "heldout-boston")["reference"]
    assert iris[:2] == ("train-iris", "accuracy") and iris[3] == 1.0

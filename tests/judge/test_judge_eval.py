"""Judge rewards through the front door (`stacx eval`): the bundled `explain` set, the oracle
agent on the process sandbox, and the default model (SmolLM2-135M) as the judge. The log holds
every judge call (JudgeScored: prompt and output ids, reply, scores), the reward is the rubric's
combination of the verifier's and the judge's, and a judge that cannot score is an
infrastructure failure (InfraFailed judge), never a reward of 0."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from stacx.launch.launcher import launch
from stacx.launch.presets import check_recipe, check_rows
from stacx.store.db import connect_run

EXPLAIN = Path(__file__).resolve().parents[2] / "recipes" / "tasks" / "explain"

TASKS = ("explain-dns", "explain-http-404-vs-500")


def stacx_eval(run_dir: Path, *sets: str) -> subprocess.CompletedProcess[str]:
    args = [
        "--tasks",
        "explain",
        "--agent",
        "oracle",
        "--sandbox",
        "process",
        "--max-attempts",
        "1",
        "--run-dir",
        str(run_dir),
    ]
    for task in TASKS:
        args += ["--include", task]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(
        [sys.executable, "-m", "stacx", "eval", *args],
        capture_output=True,
        text=True,
        timeout=900,
        env=os.environ.copy(),
    )


@pytest.mark.model
def test_default_model_judges_and_the_reward_combines_both_parts(tmp_path: Path) -> None:
    run = tmp_path / "R"
    proc = stacx_eval(run, 'judge.path="default"', 'judge.device="cpu"', "judge.max_len=4096")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    con = connect_run(run)
    calls = con.execute(
        "SELECT s.task_id, j.judge, j.rubric, j.call, j.attempt, j.criteria, len(j.prompt_ids),"
        " j.output_ids, j.reply, j.scores_json, j.score, j.error FROM judge_scored j"
        " JOIN episode_started s USING (episode_id) ORDER BY 1"
    ).fetchall()
    assert [c[0] for c in calls] == list(TASKS)  # one batched call each, no re-ask
    for (
        task,
        judge,
        rubric,
        call,
        attempt,
        criteria,
        n_prompt,
        out,
        reply,
        scores,
        score,
        err,
    ) in calls:
        assert (judge, call, attempt, err) == ("judge", 0, 0, "")
        assert rubric.endswith(f"explain/{task}/tests/judge.toml")
        assert criteria == ["correct", "clear"] and n_prompt > 100 and len(out) >= 3
        assert reply.startswith("correct: ") and "\nclear: " in reply  # decoding = "choices"
        parts = json.loads(scores)
        assert set(parts) == {"correct", "clear"} and all(0 <= v <= 1 for v in parts.values())
        assert score == pytest.approx((2 * parts["correct"] + parts["clear"]) / 3)  # weighted_mean
    rewards = con.execute(
        "SELECT s.task_id, r.reward, r.metrics_json FROM reward_assigned r"
        " JOIN episode_started s USING (episode_id) ORDER BY 1"
    ).fetchall()
    for (task, reward, metrics), call in zip(rewards, calls, strict=True):
        m = json.loads(metrics)
        assert m["verifier_reward"] == 1.0 and m["words"] > 10  # the oracle passes the format check
        assert m["judge"] == pytest.approx(call[10])
        assert m["judge.correct"] == json.loads(call[9])["correct"]
        assert reward == pytest.approx(0.3 * 1.0 + 0.7 * m["judge"]) == m["reward"], task
    view = con.execute(
        "SELECT task_id, verifier_reward, judge_score, reward, reply FROM judge_scores ORDER BY 1"
    ).fetchall()
    assert [(v[0], v[3]) for v in view] == [(r[0], r[1]) for r in rewards]
    assert con.execute("SELECT count(*) FROM infra_failed").fetchone() == (0,)


def test_a_judge_that_fails_is_an_infra_failure_never_a_zero(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on: the judge server is down
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = tmp_path / "R"
    proc = stacx_eval(
        run,
        'judge.path="default"',
        'judge.backend="openai"',
        f'judge.url="http://127.0.0.1:{port}/v1"',
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr  # samples unscored: infra failures
    con = connect_run(run)
    assert con.execute("SELECT count(*) FROM reward_assigned").fetchone() == (0,)
    failed = con.execute(
        "SELECT failure_kind, message FROM infra_failed WHERE episode_id IS NOT NULL"
    ).fetchall()
    assert len(failed) == len(TASKS)
    assert all(kind == "judge" and "engine error" in msg for kind, msg in failed), failed
    # every attempt is in the log (1 + the rubric's 2 re-asks per episode), with its error
    calls = con.execute("SELECT attempt, error, output_ids FROM judge_scored").fetchall()
    assert sorted(c[0] for c in calls) == [0, 0, 1, 1, 2, 2]
    assert all(c[1].startswith("engine error") and c[2] == [] for c in calls)
    statuses = con.execute("SELECT status, failure_kind, reward FROM episodes").fetchall()
    assert statuses == [("failed", "judge", None)] * len(TASKS)


@pytest.mark.parametrize("agent", ["oracle", "null"])
def test_tasks_check_checks_the_verifier_without_a_judge(agent: str, tmp_path: Path) -> None:
    for name in TASKS:
        shutil.copytree(EXPLAIN / name, tmp_path / "set" / name)
    recipe = check_recipe(tmp_path / "set", agent)  # type: ignore[arg-type]
    assert recipe.judge.use == "off"
    recipe = msgspec.structs.replace(
        recipe, sandbox=msgspec.structs.replace(recipe.sandbox, backend="process")
    )
    outcome = asyncio.run(launch(recipe, tmp_path / "run", echo=lambda s: None))
    rows = check_rows(outcome, agent)
    assert sorted(r.task_id for r in rows) == sorted(TASKS)
    assert all(r.ok for r in rows), rows  # oracle 1.0 (its answer's format), null 0.0
    con = connect_run(tmp_path / "run")
    assert con.execute("SELECT count(*) FROM judge_scored").fetchone() == (0,)

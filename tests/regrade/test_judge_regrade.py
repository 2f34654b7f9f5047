"""`stacx regrade` with a judge, through the front door: an oracle eval of the bundled `explain`
set on the process sandbox, graded by its verifier alone (judge.use = "off"), then regraded with
a changed rubric (`--rubric`) and with a task copy whose own rubric changed (`--tasks`), the
default model (SmolLM2-135M) judging; and a judge that cannot answer is an infrastructure failure
of the regrade (EpisodeNotRegraded infra), never a reward of 0."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

from .conftest import rows, stacx

EXPLAIN = Path(__file__).resolve().parents[2] / "recipes" / "tasks" / "explain"
TASK = "explain-dns"


def verifier_only_eval(run_dir: Path) -> str:
    """One oracle episode of explain-dns, its reward the verifier's (1.0: the format passes)."""
    done = stacx(
        "eval",
        "--tasks",
        "explain",
        "--agent",
        "oracle",
        "--sandbox",
        "process",
        "--max-attempts",
        "1",
        "--include",
        TASK,
        "--set",
        "judge.use=off",
        "--run-dir",
        run_dir,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    ((episode, reward, grader),) = rows(run_dir, "select episode_id, reward, grader from episodes")
    assert (reward, grader) == (1.0, "rollout")
    assert rows(run_dir, "select count(*) from judge_scored") == [(0,)]
    return str(episode)


def changed_rubric(path: Path, combine: str) -> Path:
    """The task's rubric with another [combine] rule (what the judge computes changes)."""
    text = (EXPLAIN / TASK / "tests" / "judge.toml").read_text()
    rule = text[text.index("\n[combine]") + 1 :]
    path.write_text(text.replace(rule, f"[combine]\n{combine}\n"))
    return path


def judged(run_dir: Path, grader: str) -> tuple[float, float, list[tuple[object, ...]]]:
    """The grade `grader` gave (its reward, the judge's part) and the judge calls of its rubric."""
    ((reward, metrics),) = rows(
        run_dir, f"select reward, metrics_json from reward_assigned where grader = '{grader}'"
    )
    m = json.loads(str(metrics))
    assert m["verifier_reward"] == 1.0 and m["reward"] == reward
    rubric = grader.split("+judge:", 1)[1].rsplit("@", 1)[0]
    calls = rows(
        run_dir,
        "select episode_id, judge, call, attempt, reply, score, error "
        f"from judge_scored where rubric = '{rubric}'",
    )
    return float(str(reward)), float(m["judge"]), calls


@pytest.mark.model
def test_a_changed_rubric_is_judged_by_the_default_model_and_graded(tmp_path: Path) -> None:
    run = tmp_path / "R"
    episode = verifier_only_eval(run)
    rubric = changed_rubric(
        tmp_path / "half.toml", 'rule = "weighted_sum"\nweights = { verifier = 0.5, judge = 0.5 }'
    )
    done = stacx("regrade", run, "--rubric", rubric, "--format", "csv")
    assert done.returncode == 0 and "1 regraded (" in done.stderr, done.stderr[-3000:]
    ((grader,),) = rows(run, "select grader from episodes")  # the latest grade is the judge's
    verifier = f"verifier:{EXPLAIN / TASK / 'tests'}@"
    assert str(grader).startswith(verifier) and f"+judge:{rubric}@" in str(grader), grader
    assert str(grader).endswith("/torch:default")  # no judge recorded: the default model
    reward, judge, calls = judged(run, str(grader))
    assert reward == pytest.approx(0.5 + 0.5 * judge)
    # one batched call (decoding = "choices"), read from the replayed sandbox's answer
    assert [(c[0], c[1], c[2], c[3], c[6]) for c in calls] == [(episode, "judge", 0, 0, "")]
    assert str(calls[0][4]).startswith("correct: ") and calls[0][5] == pytest.approx(judge)
    grades = rows(run, "select grader, reward, latest from grades order by ts")
    assert grades == [("rollout", 1.0, False), (grader, reward, True)]
    # the same rubric again: already graded by this grader, the judge is not asked again
    again = stacx("regrade", run, "--rubric", rubric)
    assert again.returncode == 0 and "0 regraded, 1 skipped" in again.stderr, again.stderr[-2000:]
    assert rows(run, "select count(*) from judge_scored") == [(1,)]
    # a task copy whose own rubric changed (the task's declared rule, as in a rollout); the
    # judge named by --set (the run recorded judge.use = "off": no judge without one)
    tasks = tmp_path / "v2"
    shutil.copytree(EXPLAIN / TASK, tasks / TASK)
    changed_rubric(tasks / TASK / "tests" / "judge.toml", 'rule = "min"')
    plain = stacx("regrade", run, "--tasks", tasks)  # judge off: the verifier alone
    assert plain.returncode == 0 and "+judge:" not in plain.stdout, plain.stderr[-2000:]
    own = stacx(
        "regrade",
        run,
        "--tasks",
        tasks,
        "--set",
        "judge.use=own",
        "--set",
        'judge.path="default"',
        "--set",
        'judge.device="cpu"',
    )
    assert own.returncode == 0 and "1 regraded (" in own.stderr, own.stderr[-3000:]
    ((latest,),) = rows(run, "select grader from episodes")
    assert f"+judge:{tasks / TASK / 'tests' / 'judge.toml'}@" in str(latest), latest
    reward, judge, calls = judged(run, str(latest))
    assert reward == pytest.approx(min(1.0, judge)) and len(calls) == 1
    assert len(rows(run, "select * from grades")) == 4  # rollout, --rubric, plain, --tasks


@pytest.mark.model
def test_a_judge_that_fails_is_not_a_grade_and_the_next_regrade_retries(tmp_path: Path) -> None:
    run = tmp_path / "R"
    episode = verifier_only_eval(run)
    with socket.socket() as s:  # a port nothing listens on: the judge server is down
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = [
        "--set",
        "judge.use=own",
        "--set",
        'judge.backend="openai"',
        "--set",
        'judge.path="default"',
        "--set",
        f'judge.url="http://127.0.0.1:{port}/v1"',
    ]
    rubric = changed_rubric(tmp_path / "half.toml", 'rule = "min"')
    done = stacx("regrade", run, "--rubric", rubric, *down)
    assert done.returncode == 0 and "0 regraded, 1 infra" in done.stderr, done.stderr[-3000:]
    assert rows(run, "select reward, grader from episodes") == [(1.0, "rollout")]  # no new grade
    ((issue, message),) = rows(run, "select issue, message from episode_not_regraded")
    assert issue == "infra" and "engine error" in str(message)
    # every ask is in the log with its error (1 + the rubric's 2 re-asks)
    calls = rows(run, "select episode_id, attempt, error from judge_scored order by attempt")
    assert [(c[0], c[1]) for c in calls] == [(episode, 0), (episode, 1), (episode, 2)]
    assert all(str(c[2]).startswith("engine error") for c in calls)
    # an infra failure is retried by the next regrade (its judge calls are new events)
    retry = stacx("regrade", run, "--rubric", rubric, *down)
    assert "0 regraded, 1 infra" in retry.stderr, retry.stderr[-2000:]
    assert rows(run, "select count(*) from judge_scored") == [(6,)]
    # bad judge options are named, before anything is recorded
    other = stacx("regrade", run, "--rubric", rubric, "--set", "trainer.steps=2")
    assert other.returncode != 0 and "judge.KEY=VALUE only" in other.stderr, other.stderr[-2000:]
    bad = tmp_path / "bad.toml"
    bad.write_text('[judge]\nmode = "sometimes"\n')
    broken = stacx("regrade", run, "--rubric", bad)
    assert broken.returncode != 0 and f"--rubric: {bad}" in broken.stderr, broken.stderr[-2000:]

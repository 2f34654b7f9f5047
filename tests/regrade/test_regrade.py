"""`stacx regrade` through the front door on real Docker: an oracle eval, then regrades with a
changed verifier (new rewards, named grader, idempotent), with a changed environment (the
replay diverges: reported, not graded), training on the regraded episodes (`stacx replay`),
an SWE-agent episode of the default model whose shell commands are replayed, and a separate
verifier regraded from the artifacts an episode kept."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .conftest import copy_tasks, rows, stacx

pytestmark = pytest.mark.docker

TASKS = ("write-answer-42", "count-lines-in-file")


def oracle_eval(run_dir: Path) -> None:
    done = stacx(
        "eval",
        "--agent",
        "oracle",
        "--tasks",
        "basic",
        "--include",
        TASKS[0],
        "--include",
        TASKS[1],
        "--run-dir",
        run_dir,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(rows(run_dir, "select task_id, reward, grader from episodes")) == [
        ("count-lines-in-file", 1.0, "rollout"),
        ("write-answer-42", 1.0, "rollout"),
    ]


def stricter_verifier(root: Path) -> Path:
    """The two tasks, write-answer-42's test now expecting 43 (the oracle writes 42)."""
    tasks = copy_tasks(root, *TASKS)
    test = tasks / "write-answer-42" / "tests" / "test_outputs.py"
    test.write_text(test.read_text().replace('"42"', '"43"'))
    return tasks


def test_a_changed_verifier_gives_changed_rewards_and_names_the_grader(
    tmp_path: Path, base_image: str
) -> None:
    run = tmp_path / "R"
    oracle_eval(run)
    tasks = stricter_verifier(tmp_path / "v2")
    first = stacx(
        "regrade",
        run,
        "--tasks",
        tasks,
        "--episodes",
        "task_id = 'write-answer-42'",
        "--limit",
        "1",
    )
    assert first.returncode == 0 and "1 regraded (" in first.stderr, first.stderr[-2000:]
    done = stacx("regrade", run, "--tasks", tasks, "--format", "csv")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "1 regraded, 1 skipped" in done.stderr  # write-answer-42: done by the first
    got = {r[0]: (r[1], r[2]) for r in rows(run, "select task_id, reward, grader from episodes")}
    assert got["write-answer-42"][0] == 0.0 and got["count-lines-in-file"][0] == 1.0
    for task_id, (_, grader) in got.items():  # the tests dir it ran, and their content digest
        assert str(grader).startswith(f"verifier:{tasks / task_id / 'tests'}@"), grader
    assert f"reward 1.0 -> 0.0 by {got['write-answer-42'][1]}" in first.stderr
    grades = rows(run, "select task_id, grader, reward, latest from grades order by task_id, ts")
    assert [(t, g == "rollout", r, latest) for t, g, r, latest in grades] == [
        ("count-lines-in-file", True, 1.0, False),
        ("count-lines-in-file", False, 1.0, True),
        ("write-answer-42", True, 1.0, False),
        ("write-answer-42", False, 0.0, True),
    ]
    # the same regrade again: every episode already has this grader's grade; nothing is added
    again = stacx("regrade", run, "--tasks", tasks, "--format", "csv")
    assert again.returncode == 0 and "2 skipped" in again.stderr, again.stderr[-2000:]
    assert rows(run, "select count(*) from reward_assigned") == [(4,)]
    # the regrade went through the run's recorder as attempts of the same run
    assert rows(run, "select count(distinct run_id), count(*) from run_started") == [(1, 4)]


def test_a_replay_that_diverges_is_reported_and_not_graded(tmp_path: Path, base_image: str) -> None:
    run = tmp_path / "R"
    oracle_eval(run)
    tasks = copy_tasks(tmp_path / "env2", *TASKS)
    (tasks / "count-lines-in-file" / "environment" / "files" / "data.txt").unlink()
    (tasks / "count-lines-in-file" / "environment" / "files" / "other.txt").write_text("x\n")
    done = stacx("regrade", run, "--tasks", tasks, "--format", "csv")
    assert done.returncode == 0, done.stderr[-2000:]
    assert (
        "count-lines-in-file: DIVERGED, not regraded: turn 0 (bash): exit code 0 -> 1"
        in done.stderr
    )
    assert "1 regraded, 1 diverged" in done.stderr
    reported = rows(
        run,
        "select issue, turn, tool, recorded_exit_code, replayed_exit_code, "
        "replayed_output from episode_not_regraded",
    )
    assert len(reported) == 1
    issue, turn, tool, before, after, output = reported[0]
    assert (issue, turn, tool, before, after) == ("diverged", 0, "bash", 0, 1)
    assert "/app/data.txt: No such file or directory" in str(output)
    # the diverged episode keeps the grade it had; the other one is regraded
    assert sorted(rows(run, "select task_id, reward, grader = 'rollout' from episodes")) == [
        ("count-lines-in-file", 1.0, True),
        ("write-answer-42", 1.0, False),
    ]


@pytest.mark.model
@pytest.mark.slow
def test_stacx_replay_trains_on_the_regraded_rewards(tmp_path: Path, base_image: str) -> None:
    run = tmp_path / "R"
    oracle_eval(run)
    assert stacx("regrade", run, "--tasks", stricter_verifier(tmp_path / "v2")).returncode == 0
    trained = stacx(
        "replay",
        "--from",
        run,
        "--where",
        "reward > 0",
        "--into",
        "recipes/swe/sft_tiny.toml",
        "--run-dir",
        tmp_path / "R2",
        "--set",
        "trainer.steps=1",
        "--set",
        "eval={}",
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert "replaying 1 episodes" in trained.stderr  # write-answer-42's latest grade is 0
    source = rows(run, "select episode_id from episodes where task_id = 'count-lines-in-file'")
    imported = rows(
        tmp_path / "R2",
        "select distinct i.source_run_id, e.episode_id, e.reward "
        "from event_imported i join reward_assigned r on r.event_id = i.imported_event_id "
        "join episodes e using (episode_id)",
    )
    assert [(e, r) for _, e, r in imported] == [(source[0][0], 1.0)]
    assert rows(tmp_path / "R2", "select count(*) > 0 from train_step_finished") == [(True,)]


@pytest.mark.model
def test_an_swe_agent_episodes_shell_commands_are_replayed(tmp_path: Path, base_image: str) -> None:
    run = tmp_path / "S"
    done = stacx(
        "eval",
        "--tasks",
        "basic",
        "--include",
        "make-script-executable",
        "--format",
        "bash",
        "--max-turns",
        "1",
        "--max-new-tokens",
        "48",
        "--temperature",
        "0",
        "--run-dir",
        run,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # greedy, the default model writes the one command the task needs (pinned: if the model's
    # reply changes, this test must be rewritten, not silently pass on a no-op command)
    assert rows(
        run,
        "select arguments_json, exit_code from tool_called join tool_returned "
        "using (episode_id, turn)",
    ) == [('{"command":"chmod +x /app/run.sh"}', 0)]
    # a verifier that checks only the mode: 1.0 only if the replay ran the chmod again (the
    # fresh sandbox's run.sh is 644)
    tasks = copy_tasks(tmp_path / "v2", "make-script-executable")
    (tasks / "make-script-executable" / "tests" / "test_outputs.py").write_text(
        'import os\n\n\ndef test_executable():\n    assert os.access("/app/run.sh", os.X_OK)\n'
    )
    regraded = stacx("regrade", run, "--tasks", tasks, "--format", "csv")
    assert regraded.returncode == 0 and "1 regraded" in regraded.stderr, regraded.stderr[-2000:]
    assert rows(run, "select reward, grader like 'verifier:%' from episodes") == [(1.0, True)]
    # the same command in an environment without run.sh: its output differs, reported
    gone = copy_tasks(tmp_path / "env2", "make-script-executable") / "make-script-executable"
    (gone / "environment" / "files" / "run.sh").unlink()
    (gone / "environment" / "files" / "other.sh").write_text("echo ok\n")
    dockerfile = gone / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace("RUN chmod 644 /app/run.sh\n", ""))
    diverged = stacx("regrade", run, "--tasks", gone.parent, "--format", "csv")
    assert "1 diverged" in diverged.stderr, diverged.stderr[-2000:]
    assert rows(
        run, "select issue, tool, recorded_exit_code, replayed_exit_code from episode_not_regraded"
    ) == [("diverged", "bash", 0, 1)]


def test_a_separate_verifier_is_regraded_from_the_kept_artifacts(
    tmp_path: Path, base_image: str
) -> None:
    fixture = Path(__file__).resolve().parents[1] / "harbor" / "fixtures" / "features"
    run = tmp_path / "R"
    done = stacx(
        "eval",
        "--agent",
        "oracle",
        "--tasks",
        fixture,
        "--include",
        "separate-verifier",
        "--run-dir",
        run,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert rows(run, "select reward from episodes") == [(1.0,)]
    for name, expect, reward in (("same", "= 42 ]", 1.0), ("stricter", "= 43 ]", 0.0)):
        # an agent environment that cannot even be built: a replay could not start, so a grade
        # proves the verifier ran on what the episode left (answer, report, the marker)
        task = shutil.copytree(fixture / "separate-verifier", tmp_path / name / "separate-verifier")
        (task / "environment" / "Dockerfile").write_text("FROM debian:bookworm\nRUN false\n")
        test = task / "tests" / "test.sh"
        test.write_text(test.read_text().replace("= 42 ]", expect) + f"# {name}\n")
        regraded = stacx("regrade", run, "--tasks", tmp_path / name)
        assert "(from its artifacts)" in regraded.stderr, regraded.stderr[-2000:]
        assert rows(run, "select reward from episodes") == [(reward,)]

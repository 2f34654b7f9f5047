"""`stacx tasks check` and `prepare`: the oracle/null eval preset through the launcher, the
episode runner and the real verifier; verdicts computed from the recorded run."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import duckdb
import pytest

from stacx.launch.presets import check_tasks
from stacx.launch.scripted import SOLVE_COMMAND
from stacx.store.db import connect_run

from .conftest import make_task

pytestmark = pytest.mark.docker

GOOD_TEST = """
    if [ "$(cat /app/answer.txt 2>/dev/null)" = 42 ]; then echo 1; else echo 0; fi \\
      > /logs/verifier/reward.txt
"""


def task_set(root: Path, *, with_broken: bool = False) -> Path:
    make_task(root, "answer", test_sh=GOOD_TEST, solve_sh="echo 42 > /app/answer.txt\n")
    make_task(
        root,
        "answer-json",
        test_sh="""
            n=$(ls /app | wc -l)
            echo "{\\"reward\\": $([ -f /app/answer.txt ] && echo 1 || echo 0), \\"files\\": $n}" \\
              > /logs/verifier/reward.json
        """,
        solve_sh="echo 42 > answer.txt  # relative: the oracle runs in WORKDIR\n",
    )
    if with_broken:
        make_task(root, "no-reward", test_sh="echo oops\n", solve_sh="true\n")
    return root


async def stacx(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "stacx",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def rows_of(run_dir: Path, sql: str) -> list[tuple[object, ...]]:
    con = connect_run(run_dir)
    try:
        return con.sql(sql).fetchall()
    finally:
        con.close()


async def test_check_is_one_eval_run_of_the_oracle(tmp_path: Path, base_image: str) -> None:
    run_dir, rows = await check_tasks(task_set(tmp_path / "set"), "oracle", run_dir=tmp_path / "r")
    assert run_dir == tmp_path / "r"
    assert [(r.task_id, r.ok, r.reward) for r in rows] == [
        ("answer", True, 1.0),
        ("answer-json", True, 1.0),
    ]
    # the launcher's run: the resolved eval recipe first, then ordinary episodes
    assert rows_of(run_dir, "select recipe from run_started") == [("tasks-check-oracle",)]
    assert rows_of(run_dir, "select reward from reward_assigned") == [(1.0,), (1.0,)]
    calls = rows_of(
        run_dir,
        "select arguments_json, exit_code from tool_called "
        "join tool_returned using (episode_id, turn) where tool_called.tool = 'bash'",
    )
    assert [(json.loads(a), code) for a, code in calls] == [({"command": SOLVE_COMMAND}, 0)] * 2
    stops = rows_of(run_dir, "select stop_reason, n_turns from episodes")
    assert stops == [("submitted", 2)] * 2  # solve.sh, then submit: a token-level demonstration


async def test_cli_prepare_then_check_exit_codes(tmp_path: Path, base_image: str) -> None:
    root = task_set(tmp_path / "set", with_broken=True)
    code, out, _ = await stacx(
        "tasks", "prepare", "--tasks-dir", str(root), "--output", str(tmp_path / "t.jsonl")
    )
    assert code == 0 and "wrote 3 task(s)" in out
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    assert [json.loads(line)["task_id"] for line in lines] == ["answer", "answer-json", "no-reward"]
    code, out, _ = await stacx("tasks", "build", str(tmp_path / "t.jsonl"))
    assert code == 0 and out.count("stacx/task-") == 3

    # oracle over the set: the task without a reward fails the check (exit 1), named in the table
    code, out, _ = await stacx(
        "tasks",
        "check",
        str(tmp_path / "t.jsonl"),
        "--agent",
        "oracle",
        "--run-dir",
        str(tmp_path / "r1"),
    )
    assert code == 1
    assert "verifier_no_reward" in out and "oracle: 2/3 ok" in out
    with duckdb.connect(str(tmp_path / "r1" / "trace.duckdb"), read_only=True) as db:
        kinds = db.sql("select failure_kind, task_id from infra_failed").fetchall()
    assert kinds == [("verifier_no_reward", "no-reward")]

    # the null agent scores below 1.0 on the good tasks: exit 0
    (root / "no-reward").rename(tmp_path / "moved-away")
    code, out, _ = await stacx(
        "tasks", "check", str(root), "--agent", "null", "--run-dir", str(tmp_path / "r2")
    )
    assert code == 0, out
    assert "null: 2/2 ok" in out


async def test_healthcheck_gates_the_agent(tmp_path: Path, base_image: str) -> None:
    hc = "[environment.healthcheck]\ncommand = '{cmd}'\ninterval_sec = 0.1\nretries = 2\n"
    make_task(
        tmp_path,
        "becomes-healthy",
        test_sh=GOOD_TEST,
        solve_sh="echo 42 > /app/answer.txt\n",
        # fails once, then passes: healthy on the second attempt
        toml=hc.format(cmd="test -f /tmp/up || { touch /tmp/up; false; }"),
    )
    make_task(tmp_path, "never-healthy", test_sh=GOOD_TEST, toml=hc.format(cmd="exit 3"))
    _, rows = await check_tasks(tmp_path, "oracle", run_dir=tmp_path / "run")
    assert [(r.task_id, r.ok, r.failure) for r in rows] == [
        ("becomes-healthy", True, None),
        ("never-healthy", False, "start"),
    ]
    assert "healthcheck `exit 3` failed 2 time(s)" in rows[1].reason


async def test_a_limit_the_solution_hits_is_an_outcome_the_verifier_scores(
    tmp_path: Path, base_image: str
) -> None:
    """A child of solve.sh OOM-killed by the task's memory limit is the task's own outcome (the
    observation says so); the sandbox survived, so the verifier scores it: not infrastructure."""
    make_task(
        tmp_path,
        "tight",
        test_sh=GOOD_TEST,
        solve_sh="python3 -c 'b = bytearray(300 * 2**20)' || exit 1; echo 42 > /app/answer.txt\n",
        toml="[environment]\nmemory_mb = 96\n",
    )
    run_dir, (row,) = await check_tasks(tmp_path, "oracle", run_dir=tmp_path / "run")
    assert (row.ok, row.failure, row.reward) == (False, None, 0.0)
    assert row.reason.startswith("solve.sh exit 1")
    assert rows_of(run_dir, "select count(*) from infra_failed") == [(0,)]
    (output,) = rows_of(run_dir, "select output from tool_returned where tool = 'bash'")
    assert "out of memory" in str(output[0])


def test_sigterm_stops_a_check_and_removes_its_sandboxes(tmp_path: Path, base_image: str) -> None:
    """`kill PID` on `stacx tasks check` while its oracle runs: exit 130, no sandbox left, the
    run recorded as interrupted (before: killed where it stood, its containers left behind and
    run.json still 'running')."""
    import signal
    import subprocess
    import time

    from stacx.store.db import read_run_file

    make_task(tmp_path / "set", "slow", test_sh=GOOD_TEST, solve_sh="sleep 300\n")
    run_dir = tmp_path / "r"
    cmd = ["tasks", "check", str(tmp_path / "set"), "--agent", "oracle", "--run-dir"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "stacx", *cmd, str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def sandboxes() -> str:
        run_id = read_run_file(run_dir).get("run_id")
        ps = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=stacx.run_id={run_id}"],
            capture_output=True,
            text=True,
        )
        return ps.stdout.strip() if run_id else ""

    deadline = time.monotonic() + 300
    while not sandboxes():  # the oracle's sandbox is up (its solve.sh sleeps)
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 130, out[-3000:]
    assert "interrupted; actors stopped and sandboxes removed" in out
    assert sandboxes() == ""
    assert read_run_file(run_dir)["status"] == "interrupted"

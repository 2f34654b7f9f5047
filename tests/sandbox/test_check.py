"""`stacx tasks check` and `prepare`: scripted agents through the real verifier, recorded runs."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import duckdb
import pytest

from stacx.actors.run import RunContext
from stacx.events import RewardAssigned
from stacx.sandbox.check import check_tasks
from stacx.sandbox.tasks import discover

from .conftest import Recorder, make_task

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


async def test_check_records_episodes_through_run_context(tmp_path: Path, base_image: str) -> None:
    tasks = discover(task_set(tmp_path / "set"))
    async with RunContext(tmp_path / "run", recipe="check-test") as run:
        rows = await check_tasks(tasks, "oracle", emit=run.emit, run_id=run.run_id, concurrency=2)
        rewards = await run.query("select reward from reward_assigned order by reward")
        tools = await run.query("select tool, exit_code from tool_returned")
        finished = await run.query("select stop_reason from episode_finished")
    assert [(r.task_id, r.ok, r.reward) for r in rows] == [
        ("answer", True, 1.0),
        ("answer-json", True, 1.0),
    ]
    assert rewards.column("reward").to_pylist() == [1.0, 1.0]
    assert tools.to_pylist() == [{"tool": "bash", "exit_code": 0}] * 2
    assert finished.column("stop_reason").to_pylist() == ["agent_done"] * 2


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
    emitted = Recorder()
    rows = await check_tasks(discover(tmp_path), "oracle", emit=emitted, run_id="hc")
    assert [(r.task_id, r.ok, r.failure) for r in rows] == [
        ("becomes-healthy", True, None),
        ("never-healthy", False, "start"),
    ]
    assert "healthcheck `exit 3` failed 2 time(s)" in rows[1].reason


async def test_oracle_killed_by_memory_limit_is_oom_not_reward(
    tmp_path: Path, base_image: str
) -> None:
    make_task(
        tmp_path,
        "tight",
        test_sh=GOOD_TEST,
        solve_sh="python3 -c 'b = bytearray(300 * 2**20)'; echo 42 > /app/answer.txt\n",
        toml="[environment]\nmemory_mb = 96\n",
    )
    emitted = Recorder()
    (row,) = await check_tasks(discover(tmp_path), "oracle", emit=emitted, run_id="oom")
    assert (row.ok, row.failure, row.reward) == (False, "oom", None)
    assert emitted.of(RewardAssigned) == []

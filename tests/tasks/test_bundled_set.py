"""The bundled task set through the real verifier: the oracle solves every task, the null agent none.

One run each over all of recipes/tasks/basic (real images, real containers), as
`stacx tasks check` does it for users."""

from __future__ import annotations

import subprocess
from pathlib import Path

import duckdb
import pytest

from tests.conftest import stacx_bin

TASKS = Path(__file__).resolve().parents[2] / "recipes" / "tasks" / "basic"

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_the_set_has_at_least_40_tasks_across_difficulties() -> None:
    tasks = [p for p in TASKS.iterdir() if (p / "task.toml").is_file()]
    assert len(tasks) >= 40
    levels = {line.split("=")[1].strip().strip('"') for p in tasks
              for line in (p / "task.toml").read_text().splitlines() if line.startswith("difficulty")}
    assert {"trivial", "easy", "medium", "hard"} <= levels
    assert all((p / "solution" / "solve.sh").is_file() and (p / "tests" / "test.sh").is_file() for p in tasks)


@pytest.mark.parametrize("agent,bar", [("oracle", "= 1.0"), ("null", "< 1.0")])
def test_every_task_meets_the_bar(agent: str, bar: str, tmp_path: Path) -> None:
    run_dir = tmp_path / agent
    r = subprocess.run([stacx_bin(), "tasks", "check", str(TASKS), "--agent", agent,
                        "--concurrency", "4", "--run-dir", str(run_dir)],
                       capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    con = duckdb.connect(str(run_dir / "trace.duckdb"), read_only=True)
    n_tasks = len([p for p in TASKS.iterdir() if (p / "task.toml").is_file()])
    scored = con.execute(f"select count(*) from episodes where status = 'scored' and reward {bar}").fetchone()
    assert scored == (n_tasks,)

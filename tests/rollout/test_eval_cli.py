"""`stacx eval` as a user runs it: a subprocess, a run dir, a report with its SQL."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import stacx_bin


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([stacx_bin(), "eval", *args], capture_output=True, text=True, timeout=600)


def test_unknown_task_set_is_a_named_error() -> None:
    proc = run_cli("--tasks", "no-such-set", "--agent", "null")
    assert proc.returncode == 2
    assert "--tasks 'no-such-set'" in proc.stderr
    assert "bundled:" in proc.stderr and "basic" in proc.stderr.split("bundled:")[1]


@pytest.mark.docker
def test_null_agent_eval_prints_scores_with_their_sql(tmp_path: Path) -> None:
    run_dir = tmp_path / "R"
    proc = run_cli("--tasks", "basic", "--agent", "null", "--limit", "1", "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    assert "pass@1" in proc.stdout and "FROM episodes" in proc.stdout
    assert f"run dir: {run_dir}" in proc.stdout
    sql = subprocess.run(
        [
            stacx_bin(),
            "sql",
            str(run_dir),
            "select actor, count(*) from turns group by 1",
            "--format",
            "csv",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sql.returncode == 0, sql.stderr
    assert "null,1" in sql.stdout

"""The long-tail task set (recipes/tasks/longtail): the committed files are what
tools/make_longtail.py writes, the sandbox times are the documented heavy tail, and its tasks
run on the process backend (no Docker) with the real oracle and null agents, whose verifier
takes the task's sandbox time before it scores."""

from __future__ import annotations

import asyncio
import shutil
import statistics
import subprocess
import sys
import tomllib
from pathlib import Path

import msgspec
import pytest

from stacx.launch.launcher import launch
from stacx.launch.presets import check_recipe, check_rows

ROOT = Path(__file__).resolve().parents[2]
SET = ROOT / "recipes" / "tasks" / "longtail"


def sandbox_s() -> dict[str, float]:
    return {
        d.name: float(tomllib.loads((d / "task.toml").read_text())["metadata"]["sandbox_s"])
        for d in sorted(SET.iterdir())
        if d.is_dir()
    }


def test_committed_set_is_the_generators_and_heavy_tailed() -> None:
    check = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "make_longtail.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    times = sorted(sandbox_s().values())
    assert len(times) == 32
    assert statistics.median(times) == 1.0 and max(times) == 20.0  # the slowest 20x the median


@pytest.mark.parametrize("agent", ["oracle", "null"])
def test_tasks_run_on_the_process_backend(agent: str, tmp_path: Path) -> None:
    fast = [name for name, s in sandbox_s().items() if s == 1.0][:2]
    for name in fast:
        shutil.copytree(SET / name, tmp_path / "set" / name)
    recipe = check_recipe(tmp_path / "set", agent)  # type: ignore[arg-type]
    recipe = msgspec.structs.replace(
        recipe, sandbox=msgspec.structs.replace(recipe.sandbox, backend="process")
    )
    outcome = asyncio.run(launch(recipe, tmp_path / "run", echo=lambda s: None))
    rows = check_rows(outcome, agent)
    assert sorted(r.task_id for r in rows) == sorted(fast)
    assert all(r.ok for r in rows), rows  # oracle 1.0, null 0.0

"""`stacx sql`, `stacx runs`, `stacx events` on real run directories, as a user runs them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from stacx import events as ev
from stacx.actors.run import RunContext
from tests.backbone.factory import episode_events
from tests.conftest import stacx_bin


def stacx(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([stacx_bin(), *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
async def two_runs(tmp_path: Path) -> list[Path]:
    dirs = []
    for name, n in (("one", 4), ("two", 8)):
        async with RunContext(tmp_path / "runs" / name, recipe="cli-test") as run:
            for e in episode_events(run.run_id, n, tokens=8, seed=n):
                await run.emit(e)
        dirs.append(tmp_path / "runs" / name)
    return dirs


def test_sql_formats(two_runs: list[Path]) -> None:
    r = stacx("sql", str(two_runs[0]), "select count(*) as n from episodes", "--format", "csv")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines() == ["n", "4"]
    r = stacx(
        "sql",
        str(two_runs[0]),
        "select turn, count(*) as c from turns group by 1 order by 1",
        "--format",
        "json",
    )
    assert [json.loads(x) for x in r.stdout.splitlines()] == [{"turn": t, "c": 4} for t in range(3)]
    r = stacx("sql", str(two_runs[0]), "select status, count(*) from episodes group by 1")
    assert r.returncode == 0 and "scored" in r.stdout


def test_sql_over_several_runs(two_runs: list[Path]) -> None:
    r = stacx("sql", *map(str, two_runs), "select count(*) from episodes", "--format", "csv")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "12"


def test_not_a_run_is_a_one_line_error(tmp_path: Path) -> None:
    r = stacx("sql", str(tmp_path), "select 1")
    assert r.returncode == 2
    assert (
        r.stderr.strip().count("\n") == 0
        and str(tmp_path) in r.stderr
        and "not a STACX run" in r.stderr
    )
    r = stacx("sql", str(tmp_path / "missing"), "select 1")
    assert r.returncode == 2 and "no such directory" in r.stderr


def test_bad_query_names_the_problem(two_runs: list[Path]) -> None:
    r = stacx("sql", str(two_runs[0]), "select nope from episodes")
    assert r.returncode == 2 and "nope" in r.stderr


def test_runs_lists_status_and_counts(two_runs: list[Path]) -> None:
    r = stacx("runs", str(two_runs[0].parent), "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert [(x["status"], x["episodes"]) for x in rows] == [("completed", 4), ("completed", 8)]


def test_events_by_kind(two_runs: list[Path]) -> None:
    r = stacx("events", str(two_runs[0]), "--kind", "RewardAssigned")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(rows) == 4 and {x["kind"] for x in rows} == {"RewardAssigned"}
    r = stacx("events", str(two_runs[0]), "--kind", "Nope")
    assert r.returncode == 2 and "accepted" in r.stderr


async def test_sql_works_on_a_live_run(tmp_path: Path) -> None:
    async with RunContext(tmp_path / "live") as run:
        await run.emit(
            ev.EpisodeStarted(run_id=run.run_id, episode_id="e", task_id="t", group_id="g")
        )
        await run.sync()
        r = stacx("sql", str(tmp_path / "live"), "select count(*) from episodes", "--format", "csv")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip().splitlines()[-1] == "1"

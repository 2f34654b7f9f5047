"""The launcher's own mechanics: recipe recorded in RunStarted, resume rules (a different
recipe is refused with the diff, a rerun of a finished run adds no work), the CLI's dry run
and errors, TensorBoard output, the eval verdict.

The NATS server, DuckDB log, recorder and scheduler are real; the rollout and trainer roles are
the stand-ins of tests/launch/standins.py, because none of these checks depends on what the
roles compute, and the real roles (model, Docker) would add minutes each. The real roles are
run end to end by test_real.py, killed and resumed by test_crash.py, placed on Ray by
test_ray.py."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from stacx.errors import ConfigError
from stacx.launch.launcher import Outcome, launch
from stacx.launch.loader import load_recipe, to_dict
from stacx.store import db

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
STANDIN = HERE / "standin.toml"
QUIET = ["logging.progress='off'", "logging.interval_s=0.3"]

COUNTS = """select (select count(*) from episodes where reward is not null),
  (select max(version) from weights), (select count(distinct group_id) from task_scheduled),
  (select count(*) - count(distinct event_id) from _events), (select count(*) from run_started)"""


def counts(run_dir: Path) -> tuple[int, ...]:
    con = db.connect_run(run_dir)
    try:
        row = con.execute(COUNTS).fetchone()
    finally:
        con.close()
    assert row is not None
    return tuple(int(x or 0) for x in row)


def _png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


RECIPE = [*QUIET, "trainer.steps=2"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Outcome]:
    """One uninterrupted stand-in run (2 steps), shared by the read-only tests below."""
    run_dir = tmp_path_factory.mktemp("launch") / "r"
    out = asyncio.run(
        launch(load_recipe(STANDIN, RECIPE), run_dir, echo=lambda s: None, poll_s=0.3)
    )
    return run_dir, out


def test_run_completes_with_expected_counts(finished: tuple[Path, Outcome]) -> None:
    run_dir, out = finished
    assert not out.resumed and out.verdict == "completed"
    # 2 iterations x 2 tasks x 2 samples; versions 1..2; no event recorded twice; one attempt
    assert counts(run_dir) == (8, 2, 4, 0, 1)
    assert out.plot and _png(Path(out.plot))
    con = duckdb.connect(str(run_dir / "trace.duckdb"), read_only=True)
    (cfg,) = con.execute("select config_json from run_started").fetchone() or ("",)
    con.close()
    assert json.loads(cfg) == to_dict(
        load_recipe(STANDIN, RECIPE)
    )  # the resolved recipe is recorded


def test_later_turns_carry_new_weight_versions(finished: tuple[Path, Outcome]) -> None:
    con = db.connect_run(finished[0])
    rows = con.execute(
        "select e.iteration, min(t.weight_version) from turns t join episodes e "
        "using (episode_id) group by 1 order by 1"
    ).fetchall()
    con.close()
    # sync mode: iteration k is generated only after version k is published
    assert rows == [(0, 0), (1, 1)]


def test_tensorboard_gets_train_and_rollout_scalars(finished: tuple[Path, Outcome]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(finished[0] / "tb"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert {"train/loss", "train/reward_mean", "rollout/reward"} <= set(tags)
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2]


async def test_different_recipe_on_existing_run_is_refused_with_diff(
    finished: tuple[Path, Outcome],
) -> None:
    run_dir = finished[0]
    before = counts(run_dir)
    changed = load_recipe(STANDIN, [*QUIET, "trainer.steps=3", "tasks.group_size=4"])
    with pytest.raises(ConfigError) as info:
        await launch(changed, run_dir, echo=lambda s: None)
    msg = str(info.value)
    assert "trainer.steps: 2 -> 3" in msg and "tasks.group_size: 2 -> 4" in msg
    assert counts(run_dir) == before  # nothing was started


async def test_rerun_resumes_without_new_work(
    finished: tuple[Path, Outcome], tmp_path: Path
) -> None:
    run_dir = tmp_path / "copy"
    await asyncio.to_thread(shutil.copytree, finished[0], run_dir)
    out = await launch(load_recipe(STANDIN, RECIPE), run_dir, echo=lambda s: None, poll_s=0.3)
    assert out.resumed and out.run_id == finished[1].run_id
    assert counts(run_dir) == (8, 2, 4, 0, 2)
    # where and how a run is watched is not part of its identity: allowed on resume
    watched = load_recipe(
        STANDIN, [*RECIPE, "logging.progress='plain'", "placement.rollout.cpus=2"]
    )
    await launch(watched, run_dir, echo=lambda s: None, poll_s=0.3)
    assert counts(run_dir) == (8, 2, 4, 0, 3)


def test_cli_dry_run_prints_placement_plan_without_a_gpu(tmp_path: Path) -> None:
    from stacx.cli.run import cli

    recipe = next((ROOT / "recipes").glob("*/grpo_8b.toml"))
    result = CliRunner().invoke(cli, [str(recipe), "--dry-run", "--run-dir", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    for word in ("placement: ray", "rollout", "trainer", "gpus each", "schedule: grpo", "new run"):
        assert word in result.output
    assert not (tmp_path / "r").exists()  # a dry run starts nothing and writes nothing


def test_cli_bad_override_is_one_clear_line(tmp_path: Path) -> None:
    from stacx.cli.run import cli

    result = CliRunner().invoke(cli, [str(STANDIN), "--set", "trainer.stepz=1", "--dry-run"])
    assert result.exit_code == 2
    assert "unknown key trainer.stepz; accepted:" in result.output


async def test_eval_recipe_ends_when_every_task_is_scored(tmp_path: Path) -> None:
    recipe = load_recipe(
        STANDIN,
        [
            *QUIET,
            "algorithm.name='eval'",
            "tasks.group_size=3",
            "logging.plot=false",
            "tasks.include=['create-hello-file', 'write-answer-42']",
        ],
    )
    out = await launch(recipe, tmp_path / "r", echo=lambda s: None, poll_s=0.3)
    assert out.verdict == "completed"
    con = db.connect_run(tmp_path / "r")
    rows = con.execute("select split, count(*) from task_scheduled group by 1").fetchall()
    (scored,) = con.execute("select count(*) from episodes where status = 'scored'").fetchone() or (
        0,
    )
    con.close()
    assert rows == [("eval", 2)] and scored == 6
    assert counts(tmp_path / "r")[1] == 0  # no trainer: no weights


def test_an_actor_bug_ends_a_local_run_with_its_traceback(tmp_path: Path) -> None:
    """Strict mode (the test suite's): a placed actor that dies of a programming error ends the
    run with that error, as a crashed Ray role host does, instead of the scheduler waiting
    forever for samples nobody will score; run.json says failed."""
    sets = [*RECIPE, "placement.builders.rollout='tests.launch.standins:buggy_rollout'"]
    with pytest.raises(TypeError, match="a bug in a rollout worker"):
        asyncio.run(launch(load_recipe(STANDIN, sets), tmp_path / "r", echo=lambda s: None))
    assert json.loads((tmp_path / "r" / "run.json").read_text())["status"] == "failed"

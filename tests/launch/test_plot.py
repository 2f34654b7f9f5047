"""`stacx plot`: PNG learning curves from a run's log, and clear errors.

The run plotted is a stand-in run (tests/launch/standins.py: the real launcher, bus, recorder
and scheduler, with fake rollout and trainer roles): `stacx plot` reads only the log's views,
so a log of the same shape is all it needs, and a real run would add minutes and nothing that
this test checks. The real roles are run by test_real.py, test_crash.py and test_ray.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner

from stacx.cli.plot import cli
from stacx.launch.launcher import launch
from stacx.launch.loader import load_recipe
from tests.launch.test_launch import QUIET, STANDIN

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("plot") / "r"
    recipe = load_recipe(STANDIN, [*QUIET, "trainer.steps=2", "logging.plot=false"])
    asyncio.run(launch(recipe, d, echo=lambda s: None, poll_s=0.3))
    return d


def test_plot_writes_png_with_requested_panels(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "c.png"
    result = CliRunner().invoke(
        cli,
        [
            str(run_dir),
            "--metric",
            "reward",
            "--metric",
            "loss",
            "--metric",
            "pass_rate",
            "-o",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == PNG
    one = tmp_path / "one.png"
    CliRunner().invoke(cli, [str(run_dir), "--metric", "loss", "-o", str(one)])
    # one panel per metric, stacked: three panels make an image three times as tall
    (w3, h3), (w1, h1) = _size(out), _size(one)
    assert w3 == w1 and h3 == 3 * h1


def _size(png: Path) -> tuple[int, int]:
    """(width, height) from the PNG's IHDR chunk, which follows the 8-byte signature."""
    head = png.read_bytes()[:24]
    assert head[12:16] == b"IHDR"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_default_output_is_in_run_dir(run_dir: Path) -> None:
    result = CliRunner().invoke(cli, [str(run_dir)])
    assert result.exit_code == 0
    assert (run_dir / "curves.png").read_bytes()[:8] == PNG


def test_unknown_metric_names_accepted_ones(run_dir: Path) -> None:
    result = CliRunner().invoke(cli, [str(run_dir), "--metric", "rewardz"])
    assert result.exit_code == 2
    assert "--metric 'rewardz': accepted: reward, pass_rate" in result.output


def test_not_a_run(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, [str(tmp_path)])
    assert result.exit_code == 2 and "not a STACX run" in result.output


def test_time_accounting_panels(run_dir: Path, tmp_path: Path) -> None:
    """The time-accounting metrics read the time_accounting view (one point per version)."""
    out = tmp_path / "time.png"
    metrics = ["engine_busy", "trainer_busy", "sandbox_busy", "tokens_per_s"]
    args = [str(run_dir), *[a for m in metrics for a in ("--metric", m)], "-o", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == PNG

"""`stacx plot RUN_DIR [--metric NAME ...] [-o out.png]`: learning curves from SQL, as PNG."""

from __future__ import annotations

from pathlib import Path

import click

from stacx.cli._common import friendly_errors


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "--metric",
    "metrics",
    multiple=True,
    help="reward (default), pass_rate, train_reward, loss, turns; repeat for several panels.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Default: RUN_DIR/curves.png.",
)
@friendly_errors
def cli(run_dir: Path, metrics: tuple[str, ...], output: Path | None) -> None:
    """Write learning curves of RUN_DIR (points coloured by weight version) as a PNG."""
    from stacx.launch.plot import DEFAULT_METRICS, write_plot

    path = write_plot(run_dir, output, list(metrics) or list(DEFAULT_METRICS))
    click.echo(str(path))

"""`stacx view RUN_DIR [RUN_DIR...]`: a local, read-only web viewer over runs' logs."""

from __future__ import annotations

import contextlib
from pathlib import Path

import click

from stacx.cli._common import PORT, friendly_errors, option, require_free_port, run_interruptible


@click.command()
@click.argument(
    "run_dirs",
    nargs=-1,
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
)
@click.option("--port", type=PORT, default=0, help="Port on 127.0.0.1 (default: a free one).")
@option(
    "--sql-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=5.0,
    metavar="SECONDS",
    help="A query typed in the SQL box is interrupted after this long.",
)
@friendly_errors
def cli(run_dirs: tuple[Path, ...], port: int, sql_timeout: float) -> None:
    """Serve RUN_DIR(s) on 127.0.0.1: runs, episodes (decoded, token by token), lineage, drift
    and cost, a SQL box, two runs side by side. Works while a run is live; Ctrl-C stops it."""
    from stacx.bus.server import free_port
    from stacx.view.app import serve
    from stacx.view.source import Source

    require_free_port("127.0.0.1", port)
    source = Source(list(run_dirs), sql_timeout_s=sql_timeout)

    def ready(url: str) -> None:
        click.echo(f"stacx view: {url}  (Ctrl-C stops)")

    with contextlib.suppress(KeyboardInterrupt):
        run_interruptible(serve(source, port or free_port(), ready=ready))

"""`stacx sql RUN_DIR... "QUERY"`: SQL over one or more runs' logs (views included)."""

from __future__ import annotations

from pathlib import Path

import click
import duckdb

from stacx.cli._common import format_option, friendly_errors, render
from stacx.errors import StacxError
from stacx.store import db


@click.command()
@click.argument("args", nargs=-1, required=True, metavar="RUN_DIR... QUERY")
@format_option
@friendly_errors
def cli(args: tuple[str, ...], fmt: str) -> None:
    """Run QUERY over RUN_DIR(s): `stacx sql RUN_DIR [RUN_DIR...] "SELECT ..."`.

    Several run dirs are attached together: each event table and view covers all of them."""
    if len(args) < 2:
        raise StacxError('usage: stacx sql RUN_DIR [RUN_DIR...] "QUERY"')
    *dirs, query = args
    paths = [Path(d) for d in dirs]
    con = db.connect_run(paths[0]) if len(paths) == 1 else db.attach_runs(list(paths))
    try:
        cur = con.execute(query)
    except duckdb.Error as exc:
        raise StacxError(f"query failed: {exc}") from exc
    if cur.description is None:
        return
    cols = [d[0] for d in cur.description]
    click.echo(render(cols, cur.fetchall(), fmt))

"""`stacx runs [ROOT]`: the runs under a directory, with status and counts."""

from __future__ import annotations

from pathlib import Path

import click
import duckdb

from stacx.cli._common import format_option, friendly_errors, render
from stacx.errors import StacxError
from stacx.launch.resume import pid_alive
from stacx.store import db

COUNTS = """select (select count(*) from episodes), (select count(*) from episodes where status = 'scored'),
  (select avg(reward) from episodes), (select count(*) from infra_failed),
  (select max(version) from weights_published), (select count(*) from _events)"""


def find_runs(root: Path) -> list[Path]:
    if db.is_run(root):
        return [root]
    return sorted(p.parent for p in root.rglob(db.DB_FILE))


@click.command()
@click.argument("root", default="runs", type=click.Path(path_type=Path))
@format_option
@friendly_errors
def cli(root: Path, fmt: str) -> None:
    """List runs under ROOT (default: ./runs) with status and counts."""
    if not root.exists():
        raise StacxError(f"{root}: no such directory")
    rows = []
    for run in find_runs(root):
        meta = db.read_run_file(run)
        status = str(meta.get("status", "?"))
        if status == "running" and not pid_alive(meta.get("pid")):
            status = "dead"  # the launcher died without a clean stop; rerun to resume
        try:
            with db.connect_run(run) as con:
                counts = con.execute(COUNTS).fetchone() or ()
        except (duckdb.Error, StacxError) as exc:
            counts = (f"unreadable: {exc}",)
        rows.append((str(run), meta.get("run_id", "?"), meta.get("recipe", "?"), status, *counts))
    cols = [
        "run_dir",
        "run_id",
        "recipe",
        "status",
        "episodes",
        "scored",
        "mean_reward",
        "infra_failures",
        "weight_version",
        "events",
    ]
    rows = [tuple(r) + (None,) * (len(cols) - len(r)) for r in rows]
    click.echo(render(cols, rows, fmt))

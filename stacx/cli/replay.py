"""`stacx replay --from SRC... [--where PRED] --into RECIPE [--run-dir DIR] [--set k=v ...]`.

Past rollouts into a new training run: the episodes of the sources (run directories, or
`stacx export` files) that match PRED (SQL over the `episodes` view) are copied, all their
events, into the new run's log with provenance (`EventImported`: source run, source event id),
then RECIPE runs on that log: its trainer consumes the imported episodes as data — SFT on
filtered successes (rejection sampling), off-policy GRPO with importance correction against
the stored behaviour logprobs, DAgger over labels aggregated across runs. The `lineage` view
then tells, for each weight version, which source runs and episodes it was trained on.

Rerunning the same command resumes; the import is idempotent (derived event ids).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from stacx.cli._common import friendly_errors, run_interruptible
from stacx.errors import StacxError


@click.command()
@click.option(
    "--from",
    "sources",
    multiple=True,
    required=True,
    type=click.Path(exists=True, path_type=Path),
    help="A run dir or an export file (.jsonl/.parquet); repeatable.",
)
@click.option(
    "--where", default=None, help='SQL predicate over the episodes view, e.g. "reward > 0".'
)
@click.option(
    "--into",
    "recipe_file",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The recipe to train with.",
)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The new run's directory (default: runs/<recipe name>-replay); rerun to resume.",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY.PATH=VALUE",
    help="Override a recipe key, e.g. --set trainer.lr=1e-5 (repeatable).",
)
@friendly_errors
def cli(
    sources: tuple[Path, ...],
    where: str | None,
    recipe_file: Path,
    run_dir: Path | None,
    overrides: tuple[str, ...],
) -> None:
    """Feed past rollouts (SRC episodes matching --where) into a new training run."""
    from stacx.actors.run import RunContext
    from stacx.launch.launcher import launch
    from stacx.launch.loader import load_recipe
    from stacx.store.episodes_io import read_sources, reimport

    for s in sources:
        if not s.exists():
            raise StacxError(f"--from {s}: no such run dir or export file")
    recipe = load_recipe(recipe_file, list(overrides))
    records = read_sources(list(sources), where)
    if not records:
        raise StacxError(
            f"no episodes in {', '.join(map(str, sources))} match {where or 'anything'}"
        )
    run_dir = run_dir or Path("runs") / f"{recipe.name}-replay"
    click.echo(
        f"replaying {len(records)} episodes from {len(sources)} source(s) into {run_dir}", err=True
    )

    async def import_events(run: RunContext) -> None:
        n = 0
        assert run.publisher is not None
        for event in reimport(records, run.run_id):
            await run.publisher.submit(event)
            n += 1
        await run.publisher.flush()
        click.echo(f"imported {n // 2} events with provenance", err=True)

    t0 = time.perf_counter()
    try:
        outcome = run_interruptible(
            launch(recipe, run_dir, prepare=import_events, echo=lambda s: click.echo(s, err=True))
        )
    except KeyboardInterrupt:
        click.echo(
            f"\ninterrupted; actors stopped. Resume with the same command (run dir {run_dir}).",
            err=True,
        )
        sys.exit(130)
    click.echo(f"done in {time.perf_counter() - t0:.0f} s: run {outcome.run_id}")
    click.echo(f"run dir: {outcome.run_dir}")
    click.echo(f'sql:     stacx sql {outcome.run_dir} "select * from lineage limit 5"')
    if outcome.verdict != "completed":
        raise StacxError(f"run ended early: {outcome.verdict}")

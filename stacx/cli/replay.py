"""`stacx replay --from SRC... --into RECIPE`: past rollouts copied, with provenance, into a new
training run's log, then RECIPE trains on them.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from stacx.cli._common import friendly_errors, launch_or_exit, run_dir_option, set_option
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
@click.option("--where", help='SQL predicate over the episodes view, e.g. "reward > 0".')
@click.option(
    "--into",
    "recipe_file",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The recipe to train with.",
)
@run_dir_option("The new run's directory (default: runs/<recipe name>-replay); rerun to resume.")
@set_option("Override a recipe key, e.g. --set trainer.lr=1e-5 (repeatable).")
@friendly_errors
def cli(
    sources: tuple[Path, ...],
    where: str | None,
    recipe_file: Path,
    run_dir: Path | None,
    overrides: tuple[str, ...],
) -> None:
    """Feed past rollouts (SRC episodes matching --where) into a new training run.

    The episodes of the sources (run dirs or `stacx export` files) that match --where (SQL over
    the episodes view) are copied, all their events, into the new run's log with provenance
    (EventImported), then RECIPE's trainer consumes them: SFT on filtered successes, off-policy
    GRPO against the stored behaviour logprobs, DAgger over labels aggregated across runs. The
    lineage view tells which source runs and episodes each weight version was trained on. Rerun
    to resume; the import is idempotent."""
    from stacx.actors.run import RunContext
    from stacx.launch.loader import load_recipe
    from stacx.store.episodes_io import read_sources, reimport

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
    outcome = launch_or_exit(recipe, run_dir, prepare=import_events)
    click.echo(f"done in {time.perf_counter() - t0:.0f} s: run {outcome.run_id}")
    click.echo(f"run dir: {outcome.run_dir}")
    click.echo(f'sql:     stacx sql {outcome.run_dir} "select * from lineage limit 5"')
    if outcome.verdict != "completed":
        raise StacxError(f"run ended early: {outcome.verdict}")

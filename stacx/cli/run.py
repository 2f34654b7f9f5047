"""`stacx run RECIPE`: check the recipe and its task set, print the resolved recipe, then run it
(or, with --dry-run, print the placement and resource plan).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from stacx.cli._common import friendly_errors, launch_or_exit, run_dir_option, set_option

if TYPE_CHECKING:
    from stacx.launch.launcher import Outcome
    from stacx.launch.recipe import Recipe
    from stacx.schedule.scheduler import TaskRef


@click.command()
@click.argument("recipe_file", metavar="RECIPE", type=click.Path(path_type=Path))
@set_option("Override a recipe key (value parsed as a TOML literal), e.g. trainer.steps=2.")
@run_dir_option("Default: runs/<recipe name>. An existing run dir is resumed.")
@click.option(
    "--dry-run", is_flag=True, help="Print the placement and resource plan; start nothing."
)
@click.option("--placement", type=click.Choice(["local", "ray"]), help="Override placement.mode.")
@click.option("--quiet", is_flag=True, help="Do not print the resolved recipe.")
@friendly_errors
def cli(
    recipe_file: Path,
    overrides: tuple[str, ...],
    run_dir: Path | None,
    dry_run: bool,
    placement: str | None,
    quiet: bool,
) -> None:
    """Run a recipe (train or eval); rerun on the same run dir to resume.

    Checks the recipe and its task set and prints the resolved recipe first; --dry-run prints the
    actor placement and resource plan and starts nothing. Exit status: 0 done, 1 ended early, 2
    bad input, 130 interrupted."""
    from stacx.launch.loader import load_recipe, to_dict, to_toml

    sets = list(overrides) + ([f"placement.mode={placement}"] if placement else [])
    recipe = load_recipe(recipe_file, sets)
    run_dir = run_dir or Path("runs") / recipe.name
    from stacx.launch.launcher import selection

    tasks = selection(recipe)[0]  # the task set is checked before the plan is printed
    if not quiet:
        click.secho(f"# resolved recipe ({recipe_file})", dim=True)
        click.echo(to_toml(to_dict(recipe)))
        click.echo()
    if dry_run:
        _dry_run(recipe, run_dir, tasks)
        return
    _quiet_libraries()
    t0 = time.perf_counter()
    outcome = launch_or_exit(recipe, run_dir)
    _summary(recipe, outcome, time.perf_counter() - t0)


def _quiet_libraries() -> None:
    """Warnings only, and no download or loading bars: the progress display says enough."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    with contextlib.suppress(ImportError):
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def _summary(recipe: Recipe, outcome: Outcome, wall: float) -> None:
    """The run's last lines (progress, run dir, a query); exit 1 if it ended early."""
    f = outcome.final
    click.echo(
        f"\ndone in {wall:.0f} s: run {outcome.run_id}"
        + (f" (resumed, attempt {outcome.attempt + 1})" if outcome.resumed else "")
    )
    if f is not None:
        from stacx.launch.progress import line

        click.echo("  " + line(f, None if recipe.is_eval else recipe.trainer.steps))
    click.echo(f"run dir: {outcome.run_dir}")
    if outcome.plot:
        click.echo(f"plot:    {outcome.plot}")
    click.echo(
        f'sql:     stacx sql {outcome.run_dir} "select iteration, first_weight_version, '
        'count(*), avg(reward) from episodes group by all order by all"'
    )
    if outcome.verdict != "completed":
        click.echo(f"run ended early: {outcome.verdict}", err=True)
        sys.exit(1)


def _dry_run(recipe: Recipe, run_dir: Path, tasks: list[TaskRef]) -> None:
    from rich.console import Console
    from rich.table import Table

    from stacx.launch.launcher import scheduler_plan
    from stacx.launch.loader import to_dict
    from stacx.launch.plan import describe, roles_for
    from stacx.launch.resume import check_resume

    table = Table(title=f"placement: {recipe.placement_mode}", show_lines=True)
    for col in ("role", "count", "cpus each", "gpus each"):
        table.add_column(col, no_wrap=True)
    table.add_column("where / what", overflow="fold")
    for row in describe(recipe, roles_for(recipe)):
        table.add_row(*row)
    Console(width=max(120, shutil.get_terminal_size().columns), force_terminal=False).print(table)
    plan = scheduler_plan(recipe, tasks)
    if plan.eval:
        click.echo(f"schedule: eval, {len(plan.tasks)} tasks x {plan.group_size} samples, once")
    else:
        stale = f", max staleness {plan.max_staleness}" if plan.mode == "async" else ""
        k = plan.steps_per_iteration
        steps = f", {k} train steps after each" if k > 1 else ""
        click.echo(
            f"schedule: {recipe.algorithm.name} ({plan.mode}{stale}), {plan.iterations} iterations "
            f"of {plan.per_iteration} tasks x {plan.group_size} samples from {len(plan.tasks)} "
            f"tasks{steps}; done at weight version {plan.steps}"
        )
    previous = check_resume(run_dir, to_dict(recipe))
    state = f"resumes run {previous.run_id}" if previous else "new run"
    click.echo(f"run dir: {run_dir} ({state})")

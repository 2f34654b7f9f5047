"""`stacx eval`: tasks x model x agent x n samples -> a run directory and a report, as a preset over
the launcher (an eval recipe, recorded as the run's first event; stacx.launch.presets).
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from stacx.agents.scaffold_spec import shipped
from stacx.cli._common import (
    friendly_errors,
    option,
    render,
    run_dir_option,
    run_interruptible,
    set_option,
)
from stacx.rollout.report import SCAFFOLD_TITLE

if TYPE_CHECKING:
    from stacx.launch.presets import EvalResult

# installed:<scaffold>: a black-box scaffold behind the model gateway, shipped or a spec file
AGENTS = ("swe", "retool", "mle", "oracle", "null", *(f"installed:{name}" for name in shipped()))


def _agent(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """One of AGENTS, or installed:<path to a scaffold spec .toml> (made absolute)."""
    if value in AGENTS:
        return value
    name, _, spec = value.partition(":")
    if name == "installed" and spec.endswith(".toml"):
        return f"installed:{Path(spec).expanduser().resolve()}"
    raise click.BadParameter(
        f"{value!r}: accepted: {', '.join(AGENTS)}, or installed:PATH.toml (a scaffold spec file)"
    )


def resolve_tasks(spec: str) -> Path:
    """A task dir, a directory of tasks, a tasks.jsonl, or a bundled set name ("basic")."""
    from stacx.launch.recipe import resolve_tasks as resolve

    return resolve(spec, where="--tasks")


POSITIVE = click.IntRange(min=1)


@click.command()
@option(
    "--tasks",
    default="basic",
    help="A task dir, a directory of tasks, a tasks.jsonl, or a bundled set name.",
)
@option(
    "--model",
    default="default",
    help="An HF checkpoint directory, a hub id in the local cache, or 'default'.",
)
@option(
    "--agent",
    default="swe",
    callback=_agent,
    help=f"{' | '.join(AGENTS)} | installed:PATH.toml (a scaffold spec file of your own)",
)
@option(
    "--n",
    "n_samples",
    type=POSITIVE,
    default=1,
    help="Samples per task (the group); pass@k uses k = n.",
)
@option("--include", multiple=True, help="Only these task ids or patterns (create-*); repeatable.")
@option(
    "--difficulty",
    multiple=True,
    help="Only tasks whose metadata.difficulty is this (trivial, easy, ...); repeatable.",
)
@option("--limit", type=POSITIVE, help="Only the first N tasks.")
@option("--concurrency", type=POSITIVE, default=2, help="Episodes at once.")
@option(
    "--max-turns",
    type=POSITIVE,
    default=6,
    help="Model turns per episode (the agent loop's, or an installed scaffold's {max_turns}).",
)
@option("--max-new-tokens", type=POSITIVE, default=256, help="Tokens the model may write per turn.")
@option(
    "--temperature",
    type=click.FloatRange(min=0.0),
    default=0.7,
    help="Sampling temperature of the model (0: greedy).",
)
@option(
    "--format",
    type=click.Choice(["tool_call", "bash", "python"]),
    help="How the agent writes actions: <tool_call> JSON, one prefilled ```bash block "
    "(small models; swe), or ```python blocks (retool). Default: python for retool, else "
    "tool_call.",
)
@option(
    "--max-attempts",
    type=POSITIVE,
    default=3,
    help="Attempts per sample on infrastructure failures.",
)
@option(
    "--episode-timeout",
    "episode_timeout_s",
    type=click.FloatRange(min=1.0),
    help="Seconds per agent loop (default: each task's agent.timeout_sec).",
)
@run_dir_option("Default: runs/eval-<UTC timestamp>.")
@option(
    "--seed",
    type=int,
    default=0,
    help="Sampling seed of the agent's model calls (not used by installed scaffolds).",
)
@option(
    "--sandbox",
    "backend",
    type=click.Choice(["auto", "docker", "process"]),
    default="auto",
    help="Sandbox backend (auto: process when every task is an image-less answer task).",
)
@set_option(
    "Override a key of the eval recipe (value parsed as a TOML literal), like `stacx run --set`, "
    "e.g. sandbox.backend=remote."
)
@friendly_errors
def cli(
    tasks: str,
    agent: str,
    format: str | None,
    run_dir: Path | None,
    overrides: tuple[str, ...],
    **flags: Any,
) -> None:
    """Evaluate an agent on a task set; print pass@1, pass@k, reward, effort and failures.

    Every number comes from SQL over the run's log, printed under its table (`stacx sql`
    recomputes it). Rerun on the same run dir to resume. Exit status: 0 when every sample was
    scored (whatever the scores), 1 when some sample ended with infrastructure failures only (a
    scaffold that exits before its first model call is one) or the run stopped early, 2 on bad
    input."""
    from stacx.launch.presets import eval_recipe, run_eval

    default_format = "python" if agent in ("retool", "mle") else "tool_call"
    recipe = eval_recipe(
        tasks=str(resolve_tasks(tasks)), agent=agent, format=format or default_format, **flags
    )
    if overrides:
        from stacx.launch.loader import apply_overrides, convert, to_dict

        recipe = convert(
            apply_overrides(to_dict(recipe), list(overrides)), source="stacx eval --set"
        )
    run_dir = run_dir or Path("runs") / f"eval-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    t0 = time.perf_counter()
    result = run_interruptible(run_eval(recipe, run_dir))
    _report(result, run_dir, time.perf_counter() - t0)


def _report(result: EvalResult, run_dir: Path, wall: float) -> None:
    """Print the report's tables with their SQL; exit 1 as the command's help says."""
    for title, (sql, columns, rows) in result.tables:
        click.echo(render(columns, rows, "table", title=title))
        click.secho("\n".join("  " + line for line in sql.splitlines()), dim=True)
        click.echo()
    if result.skipped_tasks:
        click.echo(f"skipped (no solution/solve.sh): {', '.join(result.skipped_tasks)}")
    click.echo(f"run dir: {run_dir}  ({wall:.1f} s wall)")
    click.echo(f'replay this report: stacx sql {run_dir} "<any SQL above>"')
    if result.verdict != "completed":
        click.echo(f"run ended early: {result.verdict}", err=True)
        raise SystemExit(1)
    crashed = next((rows for title, (_, _, rows) in result.tables if title == SCAFFOLD_TITLE), [])
    if crashed:
        n = sum(int(r[2]) for r in crashed)  # type: ignore[call-overload]
        click.echo(
            f"the scaffold exited before any model call was answered in {n} episode(s) (table above; "
            f"its stderr: stacx view {run_dir}, or stacx sql {run_dir} "
            '"select * from scaffold_failures")',
            err=True,
        )
    if result.unscored:
        click.echo(f"{result.unscored} sample(s) ended with infrastructure failures only", err=True)
        raise SystemExit(1)

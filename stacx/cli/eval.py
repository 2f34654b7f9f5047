"""`stacx eval`: tasks x model x agent x n samples -> a run directory and a report.

A preset over the launcher (stacx.launch.presets): the flags become an eval recipe
(``algorithm.name = "eval"``), which the one launcher runs through the one episode runner, like
``stacx run recipes/eval/*.toml``; the resolved recipe is recorded as the run's first event.
Every number printed comes from SQL over the run's log once the launcher has returned (the SQL
is printed under each table), so the same report can be recomputed later with `stacx sql`.
Rerunning the same command on the same run directory resumes it. Exit status: 0 when every
sample was scored (whatever the scores), 1 when some sample ended with infrastructure failures
only (a scaffold that exited before its first model call is one: so every sample failing that
way exits 1) or the run was stopped early, 2 on bad input (a named cause).
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import click

from stacx.agents.scaffold_spec import shipped
from stacx.cli._common import friendly_errors, render, run_interruptible
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


@click.command()
@click.option(
    "--tasks",
    "tasks_spec",
    default="basic",
    show_default=True,
    help="A task dir, a directory of tasks, a tasks.jsonl, or a bundled set name.",
)
@click.option(
    "--model",
    default="default",
    show_default=True,
    help="An HF checkpoint directory, a hub id in the local cache, or 'default'.",
)
@click.option(
    "--agent",
    default="swe",
    show_default=True,
    callback=_agent,
    help=f"{' | '.join(AGENTS)} | installed:PATH.toml (a scaffold spec file of your own)",
)
@click.option(
    "--n",
    "n_samples",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Samples per task (the group); pass@k uses k = n.",
)
@click.option(
    "--include",
    multiple=True,
    help="Only these task ids or patterns (create-*); repeatable.",
)
@click.option(
    "--difficulty",
    multiple=True,
    help="Only tasks whose metadata.difficulty is this (trivial, easy, ...); repeatable.",
)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the first N tasks.")
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Episodes at once.",
)
@click.option(
    "--max-turns",
    type=click.IntRange(min=1),
    default=6,
    show_default=True,
    help="Model turns per episode (the agent loop's, or an installed scaffold's {max_turns}).",
)
@click.option(
    "--max-new-tokens",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="Tokens the model may write per turn.",
)
@click.option(
    "--temperature",
    type=click.FloatRange(min=0.0),
    default=0.7,
    show_default=True,
    help="Sampling temperature of the model (0: greedy).",
)
@click.option(
    "--format",
    "action_format",
    type=click.Choice(["tool_call", "bash", "python"]),
    default=None,
    help="How the agent writes actions: <tool_call> JSON, one prefilled ```bash block "
    "(small models; swe), or ```python blocks (retool). Default: python for retool, else "
    "tool_call.",
)
@click.option(
    "--max-attempts",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Attempts per sample on infrastructure failures.",
)
@click.option(
    "--episode-timeout",
    type=click.FloatRange(min=1.0),
    default=None,
    help="Seconds per agent loop (default: each task's agent.timeout_sec).",
)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Default: runs/eval-<UTC timestamp>.",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Sampling seed of the agent's model calls (not used by installed scaffolds).",
)
@click.option(
    "--sandbox",
    "backend",
    type=click.Choice(["auto", "docker", "process"]),
    default="auto",
    show_default=True,
    help="Sandbox backend (auto: process when every task is an image-less answer task).",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY.PATH=VALUE",
    help="Override a key of the eval recipe (value parsed as a TOML literal), like `stacx "
    "run --set`, e.g. sandbox.backend=remote.",
)
@friendly_errors
def cli(
    tasks_spec: str,
    model: str,
    agent: str,
    n_samples: int,
    include: tuple[str, ...],
    difficulty: tuple[str, ...],
    limit: int | None,
    concurrency: int,
    max_turns: int,
    max_new_tokens: int,
    temperature: float,
    action_format: str | None,
    max_attempts: int,
    episode_timeout: float | None,
    run_dir: Path | None,
    seed: int,
    backend: Literal["auto", "docker", "process"],
    overrides: tuple[str, ...],
) -> None:
    """Evaluate an agent on a task set; print pass@1, pass@k, reward, effort and failures."""
    from stacx.launch.presets import eval_recipe, run_eval

    recipe = eval_recipe(
        tasks=str(resolve_tasks(tasks_spec)),
        model=model,
        agent=agent,
        n_samples=n_samples,
        include=include,
        difficulty=difficulty,
        limit=limit,
        concurrency=concurrency,
        max_turns=max_turns,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        format=action_format or ("python" if agent in ("retool", "mle") else "tool_call"),
        max_attempts=max_attempts,
        episode_timeout_s=episode_timeout,
        seed=seed,
        backend=backend,
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
    wall = time.perf_counter() - t0
    _report(result, run_dir, wall)


def _report(result: EvalResult, run_dir: Path, wall: float) -> None:
    """Print the report's tables (each with its SQL) and where the run is; exit 1 when the run
    ended early or samples ended with infrastructure failures only."""
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
            f"the scaffold exited before its first model call in {n} episode(s) (table above; "
            f"its stderr: stacx view {run_dir}, or stacx sql {run_dir} "
            '"select * from scaffold_failures")',
            err=True,
        )
    if result.unscored:
        click.echo(f"{result.unscored} sample(s) ended with infrastructure failures only", err=True)
        raise SystemExit(1)

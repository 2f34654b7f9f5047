"""`stacx tasks`: Harbor task sets: prepare (tasks.jsonl), build (images), check (oracle/null)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from stacx.cli._common import friendly_errors, render

if TYPE_CHECKING:  # the CLI imports the engine lazily, so `stacx --help` stays fast
    from stacx.ports import Task
    from stacx.sandbox.aliases import AliasMap


@click.group()
def cli() -> None:
    """Harbor task sets: prepare, build, check."""


@cli.command()
@click.option(
    "--tasks-dir",
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="A Harbor task directory, or a directory of them.",
)
@click.option("--output", required=True, type=click.Path(dir_okay=False, path_type=Path))
@friendly_errors
def prepare(tasks_dir: Path, output: Path) -> None:
    """Parse every task under TASKS_DIR into a tasks.jsonl (one task per line)."""
    from stacx.sandbox.tasks import discover, write_jsonl

    tasks = discover(tasks_dir)
    write_jsonl(tasks, output)
    for t in tasks:
        if t.unknown:
            click.echo(
                f"note: {t.task_id}: unknown task.toml keys kept: {sorted(t.unknown)}", err=True
            )
    click.echo(f"wrote {len(tasks)} task(s) to {output}")


@cli.command()
@click.argument("source", type=click.Path(exists=True, path_type=Path))
@click.option("--force", is_flag=True, help="Rebuild even when the content-hash tag exists.")
@click.option("--concurrency", default=2, show_default=True, help="Builds at once.")
@click.option(
    "--aliases",
    "aliases_file",
    default=None,
    help="Image alias file (TOML/JSON); default $STACX_IMAGE_ALIASES.",
)
@friendly_errors
def build(source: Path, force: bool, concurrency: int, aliases_file: str | None) -> None:
    """Build the image of every task in SOURCE (a task dir, a dir of tasks, or tasks.jsonl)."""
    from stacx.sandbox.aliases import AliasMap
    from stacx.sandbox.tasks import load_tasks

    tasks = load_tasks(source)
    aliases = AliasMap.from_env(aliases_file)
    tags = asyncio.run(_build_all(tasks, aliases, force, concurrency))
    click.echo(
        render(
            ["task", "image"],
            [(t.task_id, tag) for t, tag in zip(tasks, tags, strict=True)],
            "table",
        )
    )


async def _build_all(
    tasks: list[Task], aliases: AliasMap, force: bool, concurrency: int
) -> list[str]:
    import aiodocker

    from stacx.sandbox.build import build_task_image

    slots = asyncio.Semaphore(max(concurrency, 1))
    async with aiodocker.Docker() as docker:

        async def one(task: Task) -> str:
            async with slots:
                return await build_task_image(
                    task,
                    docker,
                    aliases,
                    force=force,
                    log=lambda m: click.echo(m, err=True),
                )

        return list(await asyncio.gather(*(one(t) for t in tasks)))


@cli.command()
@click.argument("source", type=click.Path(exists=True, path_type=Path))
@click.option("--agent", type=click.Choice(["oracle", "null"]), default="oracle", show_default=True)
@click.option("--concurrency", default=2, show_default=True, help="Episodes at once.")
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to record the run (default: a new temp dir, kept; its path is printed).",
)
@click.option("--aliases", "aliases_file", default=None, help="Image alias file (TOML/JSON).")
@friendly_errors
def check(
    source: Path, agent: str, concurrency: int, run_dir: Path | None, aliases_file: str | None
) -> None:
    """Run every task with the oracle (must score 1.0) or null agent (must score < 1.0).

    The check is an eval recipe (agent oracle or null, one sample and one attempt per task)
    run by the launcher through the episode runner that training and `stacx eval` use; the
    table is computed from the run's log. Exit status 0 iff every task meets the bar; 1
    otherwise; 2 on bad input.
    """
    from stacx.launch.presets import check_tasks

    run_dir, rows = asyncio.run(
        check_tasks(
            source,
            agent,  # type: ignore[arg-type]  # click.Choice checked it
            run_dir=run_dir,
            concurrency=concurrency,
            aliases=aliases_file or "",
            progress="auto",
        )
    )
    table = [
        (
            r.task_id,
            "ok" if r.ok else "FAIL",
            None if r.reward is None else f"{r.reward:g}",
            r.failure or "",
            r.reason.splitlines()[0][:100] if r.reason else "",
            f"{r.duration_ms / 1000:.1f}",
        )
        for r in rows
    ]
    click.echo(render(["task", "status", "reward", "failure", "reason", "seconds"], table, "table"))
    n_ok = sum(r.ok for r in rows)
    click.echo(f"{agent}: {n_ok}/{len(rows)} ok; run recorded in {run_dir}")
    sys.exit(0 if rows and n_ok == len(rows) else 1)

"""`stacx tasks`: Harbor task sets: download (registry), prepare (tasks.jsonl), build, check."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from stacx.cli._common import (
    friendly_errors,
    option,
    render,
    run_dir_option,
    run_interruptible,
)

if TYPE_CHECKING:  # the CLI imports the engine lazily, so `stacx --help` stays fast
    from stacx.ports import Task
    from stacx.sandbox.aliases import AliasMap


@click.group()
def cli() -> None:
    """Harbor task sets: download, prepare, build, check."""


@cli.command()
@click.argument("dataset")
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--registry",
    help="registry.json or dataset.toml, a path or URL (default: Harbor's registry.json).",
)
@click.option(
    "--task-names-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Only the tasks named in this file (one per line).",
)
@click.option(
    "--cache",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path.home() / ".cache" / "stacx" / "harbor",
    help="Git clones and exported tasks [default: ~/.cache/stacx/harbor].",
)
@friendly_errors
def download(
    dataset: str,
    output: Path,
    registry: str | None,
    task_names_file: Path | None,
    cache: Path,
) -> None:
    """Fetch the tasks of DATASET (NAME@VERSION) from a Harbor registry into OUTPUT, each at its
    pinned git commit (cached), ready for `stacx tasks prepare/build/check` and eval."""
    from stacx.harbor.registry import DEFAULT_REGISTRY, download, load_registry, resolve

    chosen = resolve(load_registry(registry or DEFAULT_REGISTRY), dataset)
    names = None
    if task_names_file is not None:
        lines = task_names_file.read_text().splitlines()
        names = [n.strip() for n in lines if n.strip() and not n.startswith("#")]
    fetched = download(
        chosen, output, cache=cache, task_names=names, log=lambda m: click.echo(m, err=True)
    )
    hits = sum(f.cached for f in fetched)
    click.echo(
        f"{chosen.name}@{chosen.version}: {len(fetched)} task(s) in {output} "
        f"({hits} from the cache)"
    )


@cli.command()
@click.argument(
    "source", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path)
)
@click.option(
    "--tasks-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="A Harbor task directory, or a directory of them (or give it as SOURCE).",
)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path))
@friendly_errors
def prepare(source: Path | None, tasks_dir: Path | None, output: Path) -> None:
    """Parse every task under SOURCE into a tasks.jsonl (one task per line); a task that
    does not load is reported with the reason and left out (exit 1)."""
    from stacx.errors import StacxError
    from stacx.harbor.jsonl_tasks import write_jsonl
    from stacx.harbor.tasks import discover_all

    root = source or tasks_dir
    if root is None:
        raise StacxError("give the task directory (SOURCE or --tasks-dir)")
    tasks, broken = discover_all(root)
    write_jsonl(tasks, output)
    for t in tasks:
        for note in t.notes:
            click.echo(f"note: task {t.task_id}: {note}", err=True)
    for b in broken:
        click.echo(f"error: task {b.task_id}: cannot be loaded: {b.reason}", err=True)
    click.echo(f"wrote {len(tasks)} task(s) to {output}; {len(broken)} not loaded")
    if broken:
        sys.exit(1)


@cli.command()
@click.argument("source", type=click.Path(exists=True, path_type=Path))
@click.option("--force", is_flag=True, help="Rebuild even when the content-hash tag exists.")
@option("--concurrency", default=2, help="Builds at once.")
@click.option(
    "--aliases", "aliases_file", help="Image alias file (TOML/JSON); default $STACX_IMAGE_ALIASES."
)
@friendly_errors
def build(source: Path, force: bool, concurrency: int, aliases_file: str | None) -> None:
    """Build the image of every task in SOURCE (a task dir, a dir of tasks, or tasks.jsonl)."""
    from stacx.harbor.tasks import load_task_set
    from stacx.sandbox.aliases import AliasMap

    tasks, broken = load_task_set(source)
    aliases = AliasMap.from_env(aliases_file)
    try:
        rows = run_interruptible(_build_all(tasks, aliases, force, concurrency))
    except KeyboardInterrupt:
        click.echo("\ninterrupted; images built so far are kept (a rerun skips them)", err=True)
        sys.exit(130)
    rows += [(b.task_id, "not loaded", b.reason.splitlines()[0][:120]) for b in broken]
    rows.sort()
    click.echo(render(["task", "result", "image / reason"], rows, "table"))
    counts = {k: sum(r[1] == k for r in rows) for k in ("built", "cached", "failed")}
    click.echo(
        f"{len(rows)} task(s): {counts['built']} built, {counts['cached']} cache hits, "
        f"{counts['failed']} failed, {len(broken)} not loaded"
    )
    if counts["failed"] or broken:
        sys.exit(1)


async def _build_all(
    tasks: list[Task], aliases: AliasMap, force: bool, concurrency: int
) -> list[tuple[str, str, str]]:
    """(task, built | cached | failed, tag or the failure's first line), with a progress bar."""
    import aiodocker
    from rich.console import Console
    from rich.progress import Progress

    from stacx.errors import TaskError
    from stacx.sandbox.build import build_task_image

    slots = asyncio.Semaphore(max(concurrency, 1))
    async with aiodocker.Docker() as docker:
        with Progress(transient=True, console=Console(stderr=True)) as bar:
            job = bar.add_task("building", total=len(tasks))

            async def one(task: Task) -> tuple[str, str, str]:
                built: list[str] = []
                async with slots:
                    try:
                        tag = await build_task_image(
                            task, docker, aliases, force=force, log=built.append
                        )
                    except (TaskError, aiodocker.DockerError) as exc:
                        click.echo(f"{task.task_id}: {exc}", err=True)
                        return task.task_id, "failed", str(exc).splitlines()[0][:120]
                    finally:
                        bar.advance(job)
                return task.task_id, "built" if built else "cached", tag

            return list(await asyncio.gather(*(one(t) for t in tasks)))


@cli.command()
@click.argument("source", type=click.Path(exists=True, path_type=Path))
@option("--agent", type=click.Choice(["oracle", "null"]), default="oracle")
@option("--concurrency", default=2, help="Episodes at once.")
@run_dir_option("Where to record the run (default: a new temp dir, kept; its path is printed).")
@click.option("--aliases", "aliases_file", help="Image alias file (TOML/JSON).")
@friendly_errors
def check(
    source: Path, agent: str, concurrency: int, run_dir: Path | None, aliases_file: str | None
) -> None:
    """Run every task with the oracle (must score 1.0) or null agent (must score < 1.0).

    An eval recipe (one sample, one attempt per task) run through the episode runner that
    training and `stacx eval` use; the table comes from the run's log. Exit status: 0 iff every
    task meets the bar, 1 otherwise, 2 on bad input."""
    from stacx.launch.presets import check_tasks

    try:  # SIGTERM as Ctrl-C: the launcher stops its actors and removes the sandboxes
        run_dir, rows = run_interruptible(
            check_tasks(
                source,
                agent,  # type: ignore[arg-type]  # click.Choice checked it
                run_dir=run_dir,
                concurrency=concurrency,
                aliases=aliases_file or "",
                progress="auto",
            )
        )
    except KeyboardInterrupt:
        click.echo("\ninterrupted; actors stopped and sandboxes removed", err=True)
        sys.exit(130)
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
    for line in privilege_lines(source):
        click.echo(line)
    for task_id, message in warned(run_dir):
        click.echo(f"warning: task {task_id}: {message}")
    n_ok = sum(r.ok for r in rows)
    click.echo(f"{agent}: {n_ok}/{len(rows)} ok; run recorded in {run_dir}")
    sys.exit(0 if rows and n_ok == len(rows) else 1)


def warned(run_dir: Path) -> list[tuple[str, str]]:
    """The run's warnings (EpisodeWarned), one per task and message."""
    from stacx.store.db import connect_run

    with connect_run(run_dir) as con:
        found = con.execute("SELECT DISTINCT task_id, message FROM episode_warned ORDER BY 1, 2")
        return [(str(t), str(m)) for t, m in found.fetchall()]


def privilege_lines(source: Path) -> list[str]:
    """One line per task whose [environment.stacx] asks for more than the default sandbox."""
    from stacx.harbor.tasks import load_task_set
    from stacx.sandbox.privileges import requests

    tasks, _ = load_task_set(source)
    asked = [(t.task_id, requests(t.config.environment.stacx)) for t in tasks]
    return [f"privileges: task {tid} asks for {'; '.join(more)}" for tid, more in asked if more]

"""`stacx sandbox`: list and garbage-collect sandbox containers."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import click

from stacx.cli._common import friendly_errors, render

if TYPE_CHECKING:
    from stacx.sandbox.gc import SandboxInfo


async def _ls() -> list[SandboxInfo]:
    import aiodocker

    from stacx.sandbox.gc import list_sandboxes

    async with aiodocker.Docker() as docker:
        return await list_sandboxes(docker)


async def _gc(dry_run: bool, run_id: str | None) -> list[SandboxInfo]:
    import aiodocker

    from stacx.sandbox.gc import collect_garbage

    async with aiodocker.Docker() as docker:
        return await collect_garbage(docker, dry_run=dry_run, run_id=run_id)


def _rows(infos: list[SandboxInfo]) -> list[tuple[object, ...]]:
    return [
        (
            s.id,
            s.name,
            s.image,
            s.state,
            s.run_id,
            s.episode_id,
            s.pid,
            {True: "alive", False: "ORPHAN", None: f"other host ({s.host})"}[s.alive],
        )
        for s in infos
    ]


COLUMNS = ["id", "name", "image", "state", "run_id", "episode_id", "pid", "owner"]


@click.group()
def cli() -> None:
    """List and garbage-collect sandbox containers."""


@cli.command("ls")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table")
@friendly_errors
def ls(fmt: str) -> None:
    """Every STACX sandbox container, with its run, episode and owning process."""
    click.echo(render(COLUMNS, _rows(asyncio.run(_ls())), fmt))


@cli.command("gc")
@click.option("--dry-run", is_flag=True, help="Only list what would be removed.")
@click.option(
    "--run-id", default=None, help="Remove every sandbox of this run, owner alive or not."
)
@friendly_errors
def gc_(dry_run: bool, run_id: str | None) -> None:
    """Remove sandboxes whose owning process (on this host) is gone."""
    removed = asyncio.run(_gc(dry_run, run_id))
    verb = "would remove" if dry_run else "removed"
    click.echo(f"{verb} {len(removed)} sandbox container(s)")
    if removed:
        click.echo(render(COLUMNS, _rows(removed), "table"))

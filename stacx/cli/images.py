"""`stacx images`: base images built offline (debootstrap + docker import)."""

from __future__ import annotations

import click

from stacx.cli._common import friendly_errors, option, render
from stacx.sandbox import images


@click.group()
def cli() -> None:
    """Base images built offline."""


@cli.command()
@click.option("--force", is_flag=True, help="Rebuild even if the image exists.")
@option(
    "--suite",
    type=click.Choice(images.SUITES),
    default=images.SUITE,
    help="bookworm (Debian, Python 3.11), trixie (Debian, Python 3.13) or noble (Ubuntu "
    "24.04, Python 3.12, from Ubuntu's archive).",
)
@click.option("--tag", help="Image tag to build [default: stacx/base:SUITE].")
@click.option(
    "--mirror",
    help="Archive (default: $STACX_DEBIAN_MIRROR, else the host apt's, for Debian; "
    "$STACX_UBUNTU_MIRROR, else archive.ubuntu.com, for noble).",
)
@friendly_errors
def bootstrap(force: bool, suite: str, tag: str | None, mirror: str | None) -> None:
    """Build a base image (debootstrap minbase, host CA trust) with no registry.

    Idempotent unless --force. Tasks build the bases they need on first use anyway;
    `stacx images ls` shows which exist and what maps where."""
    images.bootstrap_base_image(
        tag=tag, force=force, mirror=mirror, suite=suite, log=lambda m: click.echo(m, err=True)
    )


@cli.command("ls")
@click.option("--aliases", "aliases_file", help="Image alias file (TOML/JSON).")
@friendly_errors
def ls(aliases_file: str | None) -> None:
    """The STACX bases (built or not, size) and the alias map: which FROM image goes where."""
    from stacx.sandbox.aliases import AliasMap

    rows = images.base_table()
    click.echo(render(list(rows[0]), [tuple(r.values()) for r in rows], "table"))
    amap = AliasMap.from_env(aliases_file)
    table = [(p, t, "yours") for p, t in amap.user.items()]
    table += [(p, t, "default") for p, t in amap.defaults.items()]
    click.echo(render(["FROM pattern", "base", "from"], table, "table"))
    click.echo(
        "The most specific matching pattern wins (yours before the defaults); a base "
        "is built the first time a task needs it."
    )

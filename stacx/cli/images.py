"""`stacx images`: base images built offline (debootstrap + docker import)."""

from __future__ import annotations

import click

from stacx.cli._common import friendly_errors
from stacx.sandbox import images


@click.group()
def cli() -> None:
    """Base images built offline."""


@cli.command()
@click.option("--force", is_flag=True, help="Rebuild even if the image exists.")
@click.option("--tag", default=images.BASE_IMAGE, show_default=True, help="Image tag to build.")
@click.option(
    "--mirror",
    default=None,
    help=f"Debian mirror (default: $STACX_DEBIAN_MIRROR or {images.DEFAULT_MIRROR}).",
)
@friendly_errors
def bootstrap(force: bool, tag: str, mirror: str | None) -> None:
    """Build the base image (Debian bookworm minbase, host CA trust) with no registry.

    Idempotent: does nothing when the image exists, unless --force. Task Dockerfiles whose
    FROM is ubuntu:*, debian:*, python:3.* (any registry prefix or digest) build on it; see
    $STACX_IMAGE_ALIASES for more mappings.
    """
    images.bootstrap_base_image(
        tag=tag, force=force, mirror=mirror, log=lambda m: click.echo(m, err=True)
    )

"""`stacx models`: prepare and locate the default model checkpoint."""

from __future__ import annotations

import time

import click

from stacx.cli._common import friendly_errors
from stacx.inference import models


@click.group()
def cli() -> None:
    """Prepare the default model checkpoint."""


@cli.command()
@click.option("--force", is_flag=True, help="Convert again even if the checkpoint exists.")
@friendly_errors
def prepare(force: bool) -> None:
    """Convert the bundled SmolLM2-135M-Instruct GGUF to a safetensors checkpoint, once.

    Idempotent: prints the existing checkpoint's path at once when it is there. The cache
    directory is $STACX_CACHE/models (default ~/.cache/stacx/models).
    """
    target = models.default_model_dir()
    if models.is_prepared(target) and not force:
        click.echo(str(target))
        return
    click.echo(f"converting {models.find_default_gguf().name} -> {target}", err=True)
    t0 = time.monotonic()
    path = models.prepare_default_model(force=force)
    click.echo(f"done in {time.monotonic() - t0:.1f}s", err=True)
    click.echo(str(path))


@cli.command()
@click.argument("spec", default="default")
@friendly_errors
def path(spec: str) -> None:
    """Print the local directory a model spec resolves to ('default', a directory, a hub id)."""
    click.echo(models.resolve_model(spec))

"""`stacx models`: prepare and locate the default model checkpoint."""

from __future__ import annotations

import time
from pathlib import Path

import click

from stacx import hf as models
from stacx.cli._common import friendly_errors


@click.group()
def cli() -> None:
    """Prepare the default model checkpoint."""


@cli.command()
@click.option("--force", is_flag=True, help="Convert again even if the checkpoint exists.")
@friendly_errors
def prepare(force: bool) -> None:
    """Convert the bundled SmolLM2-135M-Instruct GGUF to a safetensors checkpoint, once.

    Idempotent: prints the existing checkpoint's path when it is there. The cache directory is
    $STACX_CACHE/models (default ~/.cache/stacx/models)."""
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


@cli.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "-o", "--output", type=click.Path(path_type=Path), required=True, help="New directory."
)
@click.option("--version", type=int, help="Weight version (default: the latest).")
@click.option("--base", help="Base model (default: the run's recipe model.path).")
@click.option("--merged", is_flag=True, help="LoRA runs: the base with the adapter merged in.")
@friendly_errors
def export(
    run_dir: Path, output: Path, version: int | None, base: str | None, merged: bool
) -> None:
    """Write a run's checkpoint as a standalone HF model directory.

    Partial checkpoints (trainer.trainable) are laid over the base model, so the output loads
    anywhere a model path is accepted (--model, teacher.path, transformers, SGLang). A LoRA run's
    checkpoint is written as its PEFT adapter directory, or with --merged as the merged model."""
    from stacx.train.export import export_hf

    click.echo(str(export_hf(run_dir, output, version=version, base=base, merged=merged)))

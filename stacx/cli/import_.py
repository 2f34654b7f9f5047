"""`stacx import harbor JOBDIR... --into RUN_DIR`: Harbor job directories into a STACX log
(stacx.harbor.job_import).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from stacx.cli._common import friendly_errors, option


@click.group()
def cli() -> None:
    """Import runs made by other tools."""


@cli.command()
@click.argument("job_dirs", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option(
    "--into",
    "run_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The STACX run directory to record into (created).",
)
@option(
    "--tokenizer",
    default="default",
    help="Model whose chat template re-tokenizes text-only trajectories.",
)
@friendly_errors
def harbor(job_dirs: tuple[Path, ...], run_dir: Path, tokenizer: str) -> None:
    """Turn Harbor job dirs (or trial dirs) into a STACX run's log.

    Each trial becomes one episode: its ATIF steps' token ids, or their text tokenized through
    the model's chat template (--tokenizer) and marked retokenized. The events go through the
    normal path, so `stacx sql`, `export` and `replay --from` see them like any run's; importing
    again changes nothing."""
    from stacx.harbor.job_import import ChatTemplate, job_events, needs_tokenizer, trial_dirs
    from stacx.hf import resolve_model
    from stacx.launch.launcher import open_run

    trials = trial_dirs(list(job_dirs))
    tok: ChatTemplate | None = None
    if needs_tokenizer(list(job_dirs)):
        from transformers import AutoTokenizer

        click.echo(f"re-tokenizing text-only steps with {tokenizer}'s chat template", err=True)
        tok = AutoTokenizer.from_pretrained(resolve_model(tokenizer))  # type: ignore[assignment]

    async def record() -> tuple[str, int]:
        config: dict[str, object] = {
            "import": "harbor",
            "job_dirs": [str(p) for p in job_dirs],
            "model": {"path": tokenizer},
        }
        async with open_run(run_dir, "harbor-import", config) as (run, _):
            assert run.publisher is not None
            n = 0
            for event in job_events(list(job_dirs), run.run_id, tokenizer=tok):
                await run.publisher.submit(event)
                n += 1
            await run.publisher.flush()
            await run.sync(60)
            return run.run_id, n

    run_id, n = asyncio.run(record())
    click.echo(f"imported {len(trials)} trials ({n} events) into run {run_id} at {run_dir}")

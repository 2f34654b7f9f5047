"""`stacx export`: a run's episodes for other trainers (JSONL / Parquet), or the run as a Harbor job
directory (stacx.harbor.jobs).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from stacx.cli._common import friendly_errors, option
from stacx.errors import StacxError
from stacx.store import db
from stacx.store.episodes_io import export_row, read_records, write_export


def _run_model(run_dir: Path) -> str | None:
    from stacx.view.source import model_of

    with db.connect_run(run_dir) as con:
        row = con.execute("select config_json from run_started order by _seq limit 1").fetchone()
    return model_of(str(row[0])) if row else None


def _decoder(spec: str | None) -> Callable[[list[int]], str] | None:
    if spec == "none":
        return None
    try:
        from transformers import AutoTokenizer

        from stacx.hf import resolve_model

        tok = AutoTokenizer.from_pretrained(resolve_model(spec or "default"))
    except Exception as exc:  # messages are a convenience; token ids are the contract
        click.echo(
            f"stacx: note: no tokenizer for {spec or 'default'} ({exc}); messages left empty",
            err=True,
        )
        return None
    return lambda ids: str(tok.decode(ids, skip_special_tokens=False))


class _ExportGroup(click.Group):
    """A first argument that is not a subcommand is `stacx export episodes`' RUN_DIR."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["episodes", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_ExportGroup)
def cli() -> None:
    """Export a run: its episodes (JSONL/Parquet), or as a Harbor job directory."""


@cli.command("harbor")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The job directory to write.",
)
@click.option("--tokenizer", help="Model dir for decoding messages; 'none' to skip.")
@friendly_errors
def harbor(run_dir: Path, output: Path, tokenizer: str | None) -> None:
    """Write RUN_DIR as a Harbor job dir (result.json, trials, ATIF trajectories with ids)."""
    from stacx.harbor.jobs import export_job

    db.require_run(run_dir)
    n = export_job(run_dir, output, decode=_decoder(tokenizer or _run_model(run_dir)))
    click.echo(f"wrote {n} trials to {output}")


@cli.command("episodes")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--where", help='SQL predicate over the episodes view, e.g. "reward > 0".')
@option("--format", "fmt", type=click.Choice(["jsonl", "parquet"]), default="jsonl")
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    help="Output file (default: RUN_DIR/export/episodes.<format>).",
)
@click.option("--tokenizer", help="Model dir for decoding messages; 'none' to skip.")
@friendly_errors
def episodes(
    run_dir: Path, where: str | None, fmt: str, output: Path | None, tokenizer: str | None
) -> None:
    """Export RUN_DIR's episodes (chat messages + token ids, loss masks, rewards).

    Each row: run, episode, task and group ids, reward, status, the token trajectory (input_ids),
    loss_mask (1 on model-produced tokens), the behaviour logprobs, chat messages (decoded with
    the run's tokenizer when it loads) and events_json (the episode's events:
    `stacx replay --from FILE` re-imports them, so a replay from an export equals one from the
    run)."""
    db.require_run(run_dir)
    records = read_records(run_dir, where)
    if not records:
        raise StacxError(f"no episodes in {run_dir} match {where or 'anything'}")
    decode = _decoder(tokenizer or _run_model(run_dir))
    out = output or run_dir / "export" / f"episodes.{fmt}"
    write_export([export_row(r, decode) for r in records], out, fmt)
    click.echo(f"wrote {len(records)} episodes to {out}")

"""The `stacx` command line: one module per command (`stacx/cli/<name>.py`, a click command or group
named `cli`), imported only when invoked, so `stacx sql` never pays for torch.
"""

from __future__ import annotations

import importlib
import sys

import click

from stacx import __version__

# command name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("run", "Run a recipe (train or eval); rerun on the same run dir to resume."),
    "eval": ("eval", "Evaluate a model and agent on a task set."),
    "replay": ("replay", "Feed past rollouts into a new training run."),
    "regrade": ("regrade", "Regrade a run's episodes: replay their actions, run a new verifier."),
    "export": ("export", "Export episodes as JSONL or Parquet, or a run as a Harbor job dir."),
    "import": ("import_", "Import Harbor job directories into a STACX run."),
    "sql": ("sql", "Query one or more runs' trace logs with SQL."),
    "runs": ("runs", "List runs under a root directory."),
    "events": ("events", "Print a run's events, optionally following new ones."),
    "plot": ("plot", "Write learning curves of a run as PNG."),
    "tasks": ("tasks", "Harbor task sets: download, prepare, build, check."),
    "sandbox": (
        "sandbox",
        "Sandbox service (serve) and every host's sandboxes (hosts, ls, stats, stop, gc).",
    ),
    "images": ("images", "Base images built offline."),
    "models": ("models", "Prepare the default model checkpoint."),
    "serve": (
        "serve",
        "Serve a model over HTTP: SGLang's native subset, the OpenAI and Anthropic APIs.",
    ),
    "view": (
        "view",
        "A local read-only web viewer over runs (episodes, decoded turns, curves, SQL).",
    ),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module = importlib.import_module(f"stacx.cli.{COMMANDS[cmd_name][0]}")
        command: click.Command = module.cli
        command.name = cmd_name
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_) for name, (_, help_) in sorted(COMMANDS.items())]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="stacx")
def main() -> None:
    """STACX: roll out agents in real sandboxes, record every event, train from the log."""


def run() -> None:  # pragma: no cover - console entry for `python -m stacx`
    sys.exit(main())

"""`stacx regrade RUN`: new grades for a run's recorded episodes, by replaying their tool calls in a
fresh sandbox under a new verifier or judge (stacx.regrade.driver).

Design: docs/regrade.md
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import click

from stacx.cli._common import format_option, friendly_errors, render, run_interruptible


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--tasks",
    type=click.Path(path_type=Path),
    help="A task set (dir, task dir, .jsonl or bundled name) whose task of the same id "
    "replaces each episode's recorded task: its environment and its verifier.",
)
@click.option(
    "--rubric",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="A rubric (RewardKit judge TOML, stacx.rubric) that grades every selected "
    "episode: its judge's score joined to the verifier's reward by its [combine].",
)
@click.option(
    "--set",
    "judge_sets",
    multiple=True,
    metavar="judge.KEY=VALUE",
    help="The judge engine (the recipe's [judge] keys), over the run's recorded [judge]; "
    "none recorded: the default model. E.g. --set judge.path=/ckpt, judge.url=...",
)
@click.option(
    "--episodes",
    help="Episode ids (comma-separated) or a SQL predicate over the episodes view, "
    "e.g. \"task_id = 'sum-numbers'\". Default: every episode whose agent loop ended.",
)
@click.option("--limit", type=int, help="Regrade at most N episodes.")
@format_option
@friendly_errors
def cli(
    run_dir: Path,
    tasks: Path | None,
    rubric: Path | None,
    judge_sets: tuple[str, ...],
    episodes: str | None,
    limit: int | None,
    fmt: str,
) -> None:
    """Regrade RUN's episodes by replaying their recorded actions under a new verifier or judge.

    Each episode's recorded tool calls are replayed in a fresh sandbox of its task (or of the
    task of the same id in --tasks DIR), the verifier grades the state they leave (with a judge's
    score where a rubric applies), and the grade is recorded in RUN's log. A replay whose
    observations differ from the recorded ones is reported as diverged, never graded."""
    from stacx.regrade.driver import regrade

    try:
        outcomes = run_interruptible(
            regrade(
                run_dir,
                tasks=tasks,
                episodes=episodes,
                limit=limit,
                rubric=rubric,
                judge_sets=list(judge_sets),
                echo=lambda s: click.echo(s, err=True),
            )
        )
    except KeyboardInterrupt:
        click.echo(
            "\ninterrupted; rerun the same command to finish (done episodes are skipped)", err=True
        )
        sys.exit(130)
    rows = [
        (o.episode_id, o.task_id, o.old_reward, o.new_reward, o.issue or "regraded", o.grader)
        for o in outcomes
    ]
    columns = ["episode_id", "task_id", "old_reward", "new_reward", "outcome", "grader"]
    click.echo(render(columns, rows, fmt))
    counts = Counter(o.issue for o in outcomes)
    graded = counts.pop("", 0)
    rest = "".join(f", {n} {i}" for i, n in sorted(counts.items()))
    click.echo(f'{graded} regraded{rest} (stacx sql {run_dir} "select * from grades")', err=True)

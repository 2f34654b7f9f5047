"""`stacx regrade RUN [--tasks DIR] [--rubric FILE] [--set judge.KEY=V] [--episodes SQL|IDS]
[--limit N]`: new grades for a run's
recorded episodes (stacx.regrade.driver): each episode's recorded tool calls are replayed in a
fresh sandbox of its task (or of the task of the same id in --tasks DIR, e.g. a copy whose
tests/ changed), the verifier grades the state they leave (joined by a judge model's score where
a rubric applies: --rubric, the task's, the recipe's; stacx.regrade.judging), and the grade is
recorded in RUN's log as RewardAssigned with its grader. A replay whose observations differ from the recorded
ones is reported (EpisodeNotRegraded, issue diverged), never graded."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from stacx.cli._common import friendly_errors, render, run_interruptible


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--tasks",
    type=click.Path(path_type=Path),
    default=None,
    help="A task set (dir, task dir, .jsonl or bundled name) whose task of the same id "
    "replaces each episode's recorded task: its environment and its verifier.",
)
@click.option(
    "--rubric",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
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
    default=None,
    help="Episode ids (comma-separated) or a SQL predicate over the episodes view, "
    "e.g. \"task_id = 'sum-numbers'\". Default: every episode whose agent loop ended.",
)
@click.option("--limit", type=int, default=None, help="Regrade at most N episodes.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "csv", "json"]),
    default="table",
    show_default=True,
)
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
    """Regrade RUN's episodes by replaying their recorded actions under a new verifier or judge."""
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
    click.echo(
        render(
            ["episode_id", "task_id", "old_reward", "new_reward", "outcome", "grader"], rows, fmt
        )
    )
    graded = sum(1 for o in outcomes if not o.issue)
    counts = {
        i: sum(1 for o in outcomes if o.issue == i)
        for i in sorted({o.issue for o in outcomes} - {""})
    }
    rest = "".join(f", {n} {i}" for i, n in counts.items())
    click.echo(f'{graded} regraded{rest} (stacx sql {run_dir} "select * from grades")', err=True)

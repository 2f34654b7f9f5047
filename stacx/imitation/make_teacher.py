"""Build the frozen teacher: the default model after SFT on oracle solutions of the train split.

A stronger model cannot be downloaded here, so the teacher is made honestly stronger: the
student's own starting point (SmolLM2-135M-Instruct) fine-tuned on the oracle demonstrations
(``TurnGenerated`` with ``actor = 'oracle'`` of a scored oracle eval run) of the TRAIN split of
the task set only (``stacx.imitation.split``); the held-out tasks' solutions are never seen,
so teacher-vs-student pass rates on held-out tasks compare policies, not memory.

    python -m stacx.imitation.make_teacher --out runs/teacher [--demos RUN_DIR] [--steps 24]
        [--format bash] [--difficulty trivial --difficulty easy]

``--format`` must be the student's (recipe ``agent.format``): the demonstrations are written in
it. ``--difficulty`` narrows the task set before the split. ``--held-out-fraction 0`` fits on
every task of ``--tasks``: the setup where the teacher and the students train on one task set
(``--tasks recipes/tasks/drills``) and are measured on another (``basic``), see
tools/imitation_gap.py.

The defaults (24 steps of 4 demos, last 4 decoder layers) fit a 2-core CPU in well under an
hour; ``--device cuda --steps 80 --batch-size 8 --trainable-layers 8`` is the stronger teacher
measured in tools/imitation_gap.py (a GPU fits it in about a minute).

Without ``--demos`` an oracle eval of ``--tasks`` runs first (Docker) into ``<out>.demos``.
The output is an HF checkpoint directory (``resolve_model(out)`` loads it) plus
``stacx-teacher.json``: the demos run, the split, the steps and the loss curve.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from stacx.imitation.fit import fit, samples_for
from stacx.imitation.split import split_tasks
from stacx.sandbox.tasks import load_tasks, select
from stacx.store.db import connect_run


def task_source(spec: str) -> str:
    """A task dir, a directory of tasks, a tasks.jsonl, or a bundled set name ("basic")."""
    from stacx.cli.eval import resolve_tasks  # the CLI's resolution, so names mean the same

    return str(resolve_tasks(spec))


DEMOS_SQL = """SELECT * FROM sft_examples
WHERE actor = 'oracle' AND status = 'scored' AND reward >= 1 AND task_id IN ({ids}){turns}
ORDER BY task_id, episode_id, turn"""


async def record_demos(
    tasks: str, run_dir: Path, fmt: str = "tool_call", difficulty: list[str] | None = None
) -> None:
    """An oracle eval of every task with a solution (skipped samples are resumed on rerun)."""
    from stacx.rollout.evaluate import EvalConfig, evaluate

    config = EvalConfig(
        tasks=task_source(tasks),
        agent="oracle",
        concurrency=4,
        format=fmt,  # type: ignore[arg-type]  # checked by get_format in the agent
        difficulty=list(difficulty or []),
    )
    await evaluate(config, run_dir)


def split_of(
    tasks: str, difficulty: list[str] | None, held_out_fraction: float, seed: int
) -> tuple[list[str], list[str]]:
    """(train, held_out) task ids of `tasks` narrowed to `difficulty` (see stacx.imitation.split)."""
    narrowed = select(load_tasks(task_source(tasks)), difficulty=difficulty or ())
    return split_tasks(
        [t.task_id for t in narrowed], held_out_fraction=held_out_fraction, seed=seed
    )


def build_teacher(
    out: Path,
    *,
    demos: Path,
    tasks: str = "basic",
    difficulty: list[str] | None = None,
    model: str = "default",
    steps: int = 24,
    batch_size: int = 4,
    lr: float = 1e-4,
    held_out_fraction: float = 0.5,
    seed: int = 0,
    trainable_layers: int | None = 4,
    max_turn: int | None = None,
    device: str = "cpu",
) -> dict[str, object]:
    """SFT `model` on the train split's oracle demos of run `demos`; returns the provenance."""
    train, held_out = split_of(tasks, difficulty, held_out_fraction, seed)
    ids = ", ".join("'" + t.replace("'", "''") + "'" for t in train)
    turns = "" if max_turn is None else f" AND turn <= {int(max_turn)}"
    con = connect_run(demos)
    try:
        table = con.sql(DEMOS_SQL.format(ids=ids, turns=turns)).to_arrow_table()
    finally:
        con.close()
    if table.num_rows == 0:
        raise SystemExit(f"{demos}: no scored oracle demonstrations of the train split")
    t0 = time.time()
    losses = fit(
        model,
        samples_for(table, "sft"),
        out,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        log_every=1,
        trainable_layers=trainable_layers,
        device=device,
    )
    info: dict[str, object] = {
        "base_model": model,
        "demos_run": str(demos),
        "tasks": tasks,
        "difficulty": difficulty or [],
        "seed": seed,
        "held_out_fraction": held_out_fraction,
        "train_tasks": train,
        "held_out_tasks": held_out,
        "n_demo_turns": table.num_rows,
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "trainable_layers": trainable_layers,
        "max_turn": max_turn,
        "losses": losses,
        "fit_s": round(time.time() - t0, 1),
    }
    (out / "stacx-teacher.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m stacx.imitation.make_teacher",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    p.add_argument("--demos", type=Path, help="an oracle eval run dir (default: run one)")
    p.add_argument("--tasks", default="basic")
    p.add_argument(
        "--difficulty", action="append", help="only tasks of this metadata.difficulty (repeat)"
    )
    p.add_argument(
        "--format",
        default="tool_call",
        choices=["tool_call", "bash"],
        help="the student's agent.format: the demonstrations are written in it",
    )
    p.add_argument("--model", default="default", help="the base model (the student's start)")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--held-out-fraction", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--trainable-layers",
        type=int,
        default=4,
        help="train only the last N decoder layers (0: all)",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda")
    p.add_argument("--max-turn", type=int, help="train only on demo turns <= this")
    args = p.parse_args(argv)
    demos = args.demos or args.out.with_name(args.out.name + ".demos")
    if args.demos is None:
        asyncio.run(record_demos(args.tasks, demos, args.format, args.difficulty))
    info = build_teacher(
        args.out,
        demos=demos,
        tasks=args.tasks,
        difficulty=args.difficulty,
        model=args.model,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        held_out_fraction=args.held_out_fraction,
        seed=args.seed,
        trainable_layers=args.trainable_layers,
        max_turn=args.max_turn,
        device=args.device,
    )
    losses = info["losses"]
    assert isinstance(losses, list)
    print(
        f"teacher: {args.out} ({info['n_demo_turns']} demo turns, {args.steps} steps, "
        f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, {info['fit_s']} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

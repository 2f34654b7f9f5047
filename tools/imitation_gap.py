"""The student-teacher gap closed by DAgger and by on-policy distillation, on held-out tasks.

    python tools/imitation_gap.py --teacher runs/teacher --out runs/gap [--held-out 8] [...]

    # the measured setup (README, Learning): train on the drills, measure on `basic`
    python -m stacx.imitation.make_teacher --out runs/teacher --tasks recipes/tasks/drills \
        --held-out-fraction 0 --format bash --steps 40 --batch-size 8 --lr 1e-4 \
        --trainable-layers 8 --max-turn 0
    python tools/imitation_gap.py --teacher runs/teacher --out runs/gap \
        --tasks recipes/tasks/drills --train 114 --eval-tasks basic \
        --eval-difficulty trivial --eval-difficulty easy --held-out 26 --samples 4 \
        --format bash --max-turns 1 --max-new-tokens 96 --steps 30 --batch-size 8 --lr 1e-4 \
        --trainable-layers 8 --curve 10 20

1. The train tasks and the eval tasks: with ``--eval-tasks``, all of ``--tasks`` to train on
   and the other set to evaluate on; without it, a split of ``--tasks``
   (``stacx.imitation.split``, the same split the teacher was built with).
2. Eval the student (the base model) and the teacher on the eval tasks.
3. DAgger: ``--dagger-iterations`` rounds of a roll-in run on train tasks (beta-mixture of the
   latest student and the teacher; the teacher labels every visited state), each followed by
   SFT of the base student on ``dagger_dataset`` (every round's labels); eval.
4. OPD: one student roll-in run on train tasks (the teacher scores every student token), then
   the per-token policy gradient with advantage teacher_logprob - student_logprob on
   ``opd_batch``; eval.
5. Print the pass rates and the gap closure
   ``(student_after - student_before) / (teacher - student_before)``, with the SQL (over the
   eval runs' logs, ATTACHed) that computes them; with ``--curve N ...`` also the pass rate of
   each student after N fit steps (snapshots of the same fit). The last line is one JSON
   object.

Every stage is a run directory under --out; a rerun reuses finished stages (evals resume from
their logs, checkpoints that exist are kept). CPU budgets are small; figures are noisy."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import duckdb

from stacx.actors.run import RunContext
from stacx.agents.chat import ChatFormat
from stacx.agents.formats import get_format
from stacx.agents.loop import AgentConfig
from stacx.agents.policies import EnginePolicy, always
from stacx.events import TurnActor
from stacx.imitation.config import ImitationConfig, TeacherConfig
from stacx.imitation.fit import Objective, fit, samples_for
from stacx.imitation.iteration import schedule_iteration, wait_iteration
from stacx.imitation.make_teacher import split_of, task_source
from stacx.imitation.mixture import MixtureRollIn, MixtureRolloutManager
from stacx.imitation.teacher import TeacherActor
from stacx.inference.torch_engine import TorchEngine
from stacx.rollout.environments import DockerEnvironments
from stacx.rollout.evaluate import EvalConfig, evaluate
from stacx.rollout.manager import RolloutConfig, RolloutManager
from stacx.sandbox.tasks import Task, load_tasks, select, write_jsonl
from stacx.store.db import connect_run

GAP_SQL = """WITH rates AS (
{unions}
), r AS (SELECT * FROM rates PIVOT (any_value(pass_rate) FOR policy IN ({names})))
SELECT *,
       round((student_dagger - student_before) / nullif(teacher - student_before, 0), 3)
           AS dagger_gap_closed,
       round((student_opd - student_before) / nullif(teacher - student_before, 0), 3)
           AS opd_gap_closed
FROM r"""

RATE_SQL = """  SELECT '{name}' AS policy,
         avg(CASE WHEN r.reward >= 1 THEN 1.0 ELSE 0.0 END) AS pass_rate
  FROM {db}.reward_assigned r JOIN {db}.episode_started s USING (episode_id)"""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


async def eval_stage(model: str, tasks_file: Path, run_dir: Path, args: argparse.Namespace) -> None:
    config = EvalConfig(
        tasks=str(tasks_file),
        model=model,
        n_samples=args.samples,
        concurrency=args.concurrency,
        max_turns=args.max_turns,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        format=args.format,
        seed=args.seed,
        episode_timeout_s=args.episode_timeout,
    )
    t0 = time.time()
    await evaluate(config, run_dir)
    log(f"eval {run_dir.name}: done in {time.time() - t0:.0f} s")


async def roll_in_stage(
    algorithm: str,
    student_path: str,
    teacher_path: str,
    tasks: list[Task],
    run_dir: Path,
    args: argparse.Namespace,
    iteration: int = 0,
) -> None:
    """One DAgger (labels) or OPD (scores) iteration's roll-ins on `tasks`, recorded."""
    config = ImitationConfig(name=algorithm, beta0=args.beta0)  # type: ignore[arg-type]
    teacher_cfg = TeacherConfig(path=teacher_path, max_new_tokens=args.max_new_tokens)
    student = await asyncio.to_thread(TorchEngine, student_path, device="cpu", max_batch=8)
    teacher = await asyncio.to_thread(TorchEngine, teacher_path, device="cpu", max_batch=8)
    assert student.tokenizer is not None
    chat = ChatFormat(student.tokenizer)  # type: ignore[arg-type]
    agent = AgentConfig(
        max_turns=args.max_turns,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        seed=args.seed,
        format=args.format,
    )
    rollout = RolloutConfig(
        concurrency=args.concurrency, agent_config=agent, episode_timeout_s=args.episode_timeout
    )
    t0 = time.time()
    try:
        async with (
            RunContext(run_dir, recipe=f"gap-{algorithm}") as run,
            DockerEnvironments(run_id=run.run_id, emit=run.emit) as envs,
        ):
            student_policy = EnginePolicy(student, TurnActor.STUDENT)
            if algorithm == "dagger":
                roll_in = MixtureRollIn(
                    student_policy, EnginePolicy(teacher, TurnActor.TEACHER), config, run.run_id
                )
                run.spawn(
                    MixtureRolloutManager(roll_in=roll_in, config=rollout, envs=envs, chat=chat)
                )
            else:
                run.spawn(
                    RolloutManager(
                        config=rollout,
                        envs=envs,
                        chat=chat,
                        make_executor=lambda _t, _i: always(student_policy),
                    )
                )
            run.spawn(
                TeacherActor(
                    teacher,
                    teacher_cfg,
                    stop_token_ids=get_format(args.format).stop_token_ids(chat),
                    label=algorithm == "dagger",
                    score=algorithm == "opd",
                )
            )
            await schedule_iteration(
                run.emit, run.run_id, tasks, iteration, n_samples=args.roll_in_samples
            )
            await wait_iteration(
                run.query,
                config,
                iteration,
                len(tasks) * args.roll_in_samples,
                teacher_cfg.label_actors,
                timeout_s=args.stage_timeout,
                progress=lambda p: log(
                    f"{algorithm} roll-in {run_dir.name} iteration {iteration} pending {p}"
                ),
            )
            await run.stop_actors()
    finally:
        await student.close()
        await teacher.close()
    log(
        f"{algorithm} roll-in {run_dir.name} iteration {iteration}: done in {time.time() - t0:.0f} s"
    )


def train_stage(
    algorithm: str,
    run_dir: Path,
    out: Path,
    args: argparse.Namespace,
    *,
    steps: int | None = None,
    curve_of: Path | None = None,
    start: str | None = None,
) -> None:
    """Fit `start` (the base student by default) on the algorithm's view over `run_dir`'s log
    (DAgger: SFT on ``dagger_dataset``; OPD: policy gradient on ``opd_batch``), saving the
    --curve steps' snapshots (named after `curve_of`, by default `out`)."""
    objective: Objective = "sft" if algorithm == "dagger" else "opd"
    view = "dagger_dataset" if algorithm == "dagger" else "opd_batch"
    con = connect_run(run_dir)
    try:
        table = con.sql(f"SELECT * FROM {view}").to_arrow_table()
    finally:
        con.close()
    samples = samples_for(
        table, objective, opd_discount=args.opd_discount, opd_center=args.opd_center
    )
    steps = steps or args.steps
    log(f"train {out.name}: {len(samples)} samples, {steps} steps ({objective})")
    fit(
        start or args.student,
        samples,
        out,
        objective=objective,
        steps=steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        trainable_layers=args.trainable_layers,
        log_every=1,
        snapshots={n: snapshot_dir(curve_of or out, n) for n in args.curve if n < steps},
    )


def snapshot_dir(ckpt: Path, step: int) -> Path:
    return ckpt.with_name(f"{ckpt.name}-step{step}")


async def curve_stage(algorithm: str, held_file: Path, args: argparse.Namespace) -> dict[str, Path]:
    """Evals of the `algorithm` student at fewer training steps than the final one.

    With one round (DAgger, or OPD with ``--opd-iterations 1``) the points are snapshots of the
    fit after each ``--curve`` step count (same data, seed and constant learning rate, so step
    n of the full fit is the n-step fit). With several OPD rounds they are the checkpoints
    after each round. Names are ``<algorithm>_step<cumulative fit steps>``.
    """
    out: Path = args.out
    ckpt = out / f"student-{algorithm}"
    points: dict[int, Path] = {}
    if algorithm == "opd" and args.opd_iterations > 1:
        for i in range(args.opd_iterations - 1):
            points[(i + 1) * opd_steps(args)] = out / f"student-opd-{i}"
    else:
        final = args.steps if algorithm == "dagger" else opd_steps(args)
        steps = sorted(n for n in args.curve if n < final)
        points = {n: snapshot_dir(ckpt, n) for n in steps}
        missing = [n for n in steps if not (points[n] / "config.json").is_file()]
        if missing:  # a run from before --curve: fit again up to the last missing snapshot
            await asyncio.to_thread(
                train_stage,
                algorithm,
                out / f"{algorithm}-run",
                points[missing[-1]],
                args,
                steps=missing[-1],
                curve_of=ckpt,
            )
    evals = {}
    for n, path in sorted(points.items()):
        evals[f"{algorithm}_step{n}"] = out / f"eval-{algorithm}-step{n}"
        await eval_stage(str(path), held_file, evals[f"{algorithm}_step{n}"], args)
    return evals


def opd_steps(args: argparse.Namespace) -> int:
    return int(args.opd_steps or args.steps)


def gap_sql(evals: dict[str, Path]) -> tuple[list[str], str]:
    attach = [f"ATTACH '{p / 'trace.duckdb'}' AS {name} (READ_ONLY);" for name, p in evals.items()]
    unions = "\n  UNION ALL\n".join(RATE_SQL.format(name=n, db=n) for n in evals)
    names = ", ".join(f"'{n}'" for n in evals)
    return attach, GAP_SQL.format(unions=unions, names=names)


def prepare(args: argparse.Namespace) -> tuple[list[Task], Path, str]:
    """The train tasks to roll in, a tasks file to eval on, and the teacher path.

    Without ``--eval-tasks`` the task set is split (the teacher's split): roll-ins on the train
    half, evals on the held-out half (or, with ``--eval-on train``, on the train half: the
    in-distribution gap). With ``--eval-tasks`` every task of ``--tasks`` is a train task and
    the evals run on the other set, which no stage ever trained on.
    """
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    all_tasks = load_tasks(task_source(args.tasks))
    if args.eval_tasks:
        train = select(all_tasks, difficulty=args.difficulty or ())[: args.train]
        held = select(
            load_tasks(task_source(args.eval_tasks)), difficulty=args.eval_difficulty or ()
        )
        held = held[: args.held_out]
    else:
        train_ids, held_ids = split_of(args.tasks, args.difficulty, 0.5, args.split_seed)
        by_id = {t.task_id: t for t in all_tasks}
        train = [by_id[i] for i in train_ids][: args.train]
        held = [by_id[i] for i in held_ids][: args.held_out]
        held = held if args.eval_on == "held-out" else train
    held_file = out / f"eval_{args.eval_on}.jsonl"
    write_jsonl(held, held_file)
    log(f"train tasks {len(train)}, eval tasks {len(held)}: {[t.task_id for t in held]}")
    return train, held_file, str(Path(args.teacher).resolve())


async def dagger_stage(
    teacher: str, train: list[Task], out: Path, args: argparse.Namespace
) -> Path:
    """``--dagger-iterations`` rounds of roll-in (by the latest student) + SFT of the base
    student on ``dagger_dataset``, which aggregates every round's labels (one run's log)."""
    run_dir, student = out / "dagger-run", args.student
    for i in range(args.dagger_iterations):
        ckpt = out / (
            "student-dagger" if i == args.dagger_iterations - 1 else f"student-dagger-{i}"
        )
        if not (ckpt / "config.json").is_file():
            await roll_in_stage("dagger", student, teacher, train, run_dir, args, iteration=i)
            await asyncio.to_thread(train_stage, "dagger", run_dir, ckpt, args)
        student = str(ckpt)
    return out / "student-dagger"


async def opd_stage(teacher: str, train: list[Task], out: Path, args: argparse.Namespace) -> Path:
    """``--opd-iterations`` on-policy rounds: a roll-in by the latest student (the teacher
    scores every sampled token), then ``--opd-steps`` policy-gradient steps from that student
    on that round's ``opd_batch`` only. One round trains many steps on the base student's
    samples: the clipped ratio then caps how far each token can move."""
    student = args.student
    for i in range(args.opd_iterations):
        ckpt = out / ("student-opd" if i == args.opd_iterations - 1 else f"student-opd-{i}")
        run_dir = out / ("opd-run" if i == 0 else f"opd-run-{i}")
        if not (ckpt / "config.json").is_file():
            await roll_in_stage("opd", student, teacher, train, run_dir, args)
            await asyncio.to_thread(
                train_stage, "opd", run_dir, ckpt, args, steps=opd_steps(args), start=student
            )
        student = str(ckpt)
    return out / "student-opd"


async def main_async(
    args: argparse.Namespace, train: list[Task], held_file: Path, teacher: str
) -> dict[str, object]:
    out: Path = args.out
    tag = "" if args.eval_on == "held-out" else "-train"
    evals = {
        "student_before": out / f"eval-student{tag}",
        "teacher": out / f"eval-teacher{tag}",
        "student_dagger": out / f"eval-dagger{tag}",
        "student_opd": out / f"eval-opd{tag}",
    }
    await eval_stage(args.student, held_file, evals["student_before"], args)
    await eval_stage(teacher, held_file, evals["teacher"], args)
    ckpt = await dagger_stage(teacher, train, out, args)
    await eval_stage(str(ckpt), held_file, evals["student_dagger"], args)
    ckpt = await opd_stage(teacher, train, out, args)
    await eval_stage(str(ckpt), held_file, evals["student_opd"], args)
    attach, sql = gap_sql(evals)
    con = duckdb.connect()
    for stmt in attach:
        con.execute(stmt)
    table = con.sql(sql).to_arrow_table().to_pylist()[0]
    con.close()  # the eval runs stay usable by other processes
    print("\n".join(attach))
    print(sql + ";")
    print(json.dumps(table, indent=2, default=str))
    result: dict[str, object] = {"train_tasks": len(train), **table}
    if args.curve or args.opd_iterations > 1:
        curve = {"student_before": evals["student_before"]}
        curve |= await curve_stage("dagger", held_file, args)
        curve |= await curve_stage("opd", held_file, args)
        curve |= {"student_dagger": evals["student_dagger"], "student_opd": evals["student_opd"]}
        result["curve"] = curve_table(curve, args)
    return result


def curve_table(evals: dict[str, Path], args: argparse.Namespace) -> dict[str, dict[int, float]]:
    """{algorithm: {fit steps: held-out pass rate}}, from the eval runs' logs (RATE_SQL)."""
    con = duckdb.connect()
    rates = {}
    for name, path in evals.items():
        con.execute(f"ATTACH '{path / 'trace.duckdb'}' AS {name} (READ_ONLY)")
        rates[name] = con.sql(RATE_SQL.format(name=name, db=name)).fetchall()[0][1]
    table: dict[str, dict[int, float]] = {}
    for algorithm, final in (
        ("dagger", args.steps),
        ("opd", opd_steps(args) * args.opd_iterations),
    ):
        points = {0: rates["student_before"], final: rates[f"student_{algorithm}"]}
        points |= {
            int(n.rsplit("step", 1)[1]): r
            for n, r in rates.items()
            if n.startswith(f"{algorithm}_step")
        }
        table[algorithm] = dict(sorted(points.items()))
        print(
            f"curve {algorithm}: "
            + ", ".join(f"{k} steps {v:.3f}" for k, v in table[algorithm].items())
        )
    con.close()
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--teacher", required=True, help="teacher checkpoint (make_teacher --out)")
    p.add_argument("--student", default="default")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tasks", default="basic")
    p.add_argument("--difficulty", action="append", help="as make_teacher's (the same split)")
    p.add_argument("--format", default="tool_call", choices=["tool_call", "bash"])
    p.add_argument("--split-seed", type=int, default=0)
    p.add_argument("--held-out", type=int, default=8, help="held-out tasks evaluated (first N)")
    p.add_argument("--train", type=int, default=8, help="train tasks rolled in (first N)")
    p.add_argument("--eval-on", choices=["held-out", "train"], default="held-out")
    p.add_argument("--eval-tasks", help="evaluate on this task set instead of a split of --tasks")
    p.add_argument("--eval-difficulty", action="append", help="narrow --eval-tasks (repeat)")
    p.add_argument("--dagger-iterations", type=int, default=1)
    p.add_argument("--opd-iterations", type=int, default=1, help="on-policy OPD rounds")
    p.add_argument("--opd-steps", type=int, help="fit steps per OPD round (default: --steps)")
    p.add_argument(
        "--opd-discount",
        type=float,
        default=0.0,
        help="0: per-token log ratio; 1: summed over the turn's later tokens",
    )
    p.add_argument("--opd-center", action="store_true", help="subtract the round's mean advantage")
    p.add_argument(
        "--curve",
        type=int,
        nargs="*",
        default=[],
        help="also evaluate the students after these many fit steps (a learning curve)",
    )
    p.add_argument("--samples", type=int, default=1, help="eval samples per task")
    p.add_argument("--roll-in-samples", type=int, default=1, help="roll-ins per train task")
    p.add_argument("--episode-timeout", type=float, help="agent-loop seconds (default: the task's)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=192)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--beta0", type=float, default=0.5)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--trainable-layers", type=int, default=6)
    p.add_argument("--stage-timeout", type=float, default=3600)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    train, held_file, teacher = prepare(args)
    result = asyncio.run(main_async(args, train, held_file, teacher))
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

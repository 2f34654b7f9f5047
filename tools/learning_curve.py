"""Learning curve at the trainer level: the real engine samples, a verifiable reward scores, the
Trainer actor learns through the log, the engine loads each new version; the curve is SQL.

Task: short prompts whose answer is verifiable by a substring (reward 1 when the completion
contains the target, else 0), e.g. "Pick one colour, red or blue. Answer in one word." -> "blue".
Each iteration samples ``--samples`` completions per prompt (one GRPO group per prompt) at the
engine's current weight version, records them as TurnGenerated/RewardAssigned events, and (sync
mode) waits for the trainer's next version to be loaded before the next iteration. The last
iteration only measures. With ``--algorithm sft`` every training iteration's samples are
accompanied by oracle demonstrations (actor='oracle', the target answer; never in the curve)
that the trainer imitates (filter ``actor = 'oracle'``).

    python tools/learning_curve.py --run-dir /tmp/lc-grpo --iterations 6
    python tools/learning_curve.py --run-dir /tmp/lc-sft --algorithm sft --iterations 4
    stacx sql /tmp/lc-grpo "select * from reward_by_weight_version order by weight_version"

Prints the curve (reward_by_weight_version) and, last, one JSON line {first, last, gain, ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stacx import events as ev
from stacx.actors.run import RunContext
from stacx.inference.engine import SamplingParams
from stacx.inference.torch_engine import TorchEngine
from stacx.train.config import TrainerConfig
from stacx.train.sync import WeightSync
from stacx.train.trainer import Trainer

PROMPTS: list[tuple[str, str]] = [
    ("Pick one colour, red or blue. Answer in one word.", "blue"),
    ("Pick one animal, cat or dog. Answer in one word.", "dog"),
    ("Pick one fruit, apple or pear. Answer in one word.", "pear"),
    ("Pick one number, 3 or 8. Answer with the number.", "8"),
]

CURVE_SQL = (
    "select weight_version, n_episodes, round(reward_mean, 3) as reward_mean "
    "from reward_by_weight_version where weight_version is not null order by weight_version"
)


Sampled = tuple[list[int], list[float] | None, int | None, str, float]
"""(output ids, behaviour logprobs, weight version, actor, reward) of one single-turn episode."""


def chat_ids(tokenizer: object, question: str) -> list[int]:
    """The chat prompt without the template's default system message (short prompts: cheap)."""
    text = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    return list(tokenizer.encode(text, add_special_tokens=False))  # type: ignore[attr-defined]


def reward(task: str, text: str, target: str, finish_reason: str) -> float:
    """``target``: 1 when the completion contains the target answer. ``short``: 1 when the
    completion ends by itself within the token budget (a very easy, robust signal)."""
    if task == "short":
        return 1.0 if finish_reason == "stop" else 0.0
    return 1.0 if target.lower() in text.lower() else 0.0


def _demo(task: str, target: str) -> str:
    return target.capitalize() + ("." if task == "short" else "")


async def iteration(
    run: RunContext, engine: TorchEngine, it: int, args: argparse.Namespace, demos: int
) -> float:
    """Sample and score one group per prompt (the student, at the engine's version); with
    ``demos`` > 0 also record that many oracle demonstrations per prompt. Returns the students'
    mean reward."""
    tok = engine.tokenizer
    params = SamplingParams(
        max_new_tokens=args.max_new_tokens, temperature=1.0, seed=args.seed * 1000 + it * 100
    )
    prompts = PROMPTS[: args.prompts]
    ids = [chat_ids(tok, q) for q, _ in prompts]
    # one generate call for every sample of every prompt: the engine batches them all
    gens = await engine.generate([p for p in ids for _ in range(args.samples)], params)
    total = 0.0
    for j, (_question, target) in enumerate(prompts):
        samples: list[Sampled] = []
        for g in gens[j * args.samples : (j + 1) * args.samples]:
            text = tok.decode(g.output_ids, skip_special_tokens=True)  # type: ignore[attr-defined]
            r = reward(args.task, text, target, g.finish_reason)
            samples.append((g.output_ids, g.logprobs, g.weight_version, "student", r))
        total += sum(x[-1] for x in samples)
        await record_group(run, f"it{it}-p{j}", f"p{j}", it, ids[j], samples)
        if demos:
            answer = tok.encode(_demo(args.task, target) + "<|im_end|>", add_special_tokens=False)  # type: ignore[attr-defined]
            oracle: list[Sampled] = [(list(answer), None, None, "oracle", 1.0)] * demos
            await record_group(run, f"it{it}-p{j}-oracle", f"p{j}", it, ids[j], oracle)
    return total / (len(prompts) * args.samples)


async def record_group(
    run: RunContext, group: str, task: str, it: int, prompt: list[int], samples: list[Sampled]
) -> None:
    """The events a rollout manager records for one group of single-turn episodes."""
    await run.emit(
        ev.TaskScheduled(
            run_id=run.run_id,
            task_id=task,
            task_path="-",
            group_id=group,
            n_samples=len(samples),
            iteration=it,
        )
    )
    for i, (output, logprobs, version, actor, r) in enumerate(samples):
        episode = f"{group}-s{i}"
        await run.emit(
            ev.EpisodeStarted(
                run_id=run.run_id,
                episode_id=episode,
                task_id=task,
                group_id=group,
                sample_index=i,
                iteration=it,
                policy=actor,
            )
        )
        await run.emit(
            ev.TurnGenerated(
                run_id=run.run_id,
                episode_id=episode,
                turn=0,
                prompt_ids=prompt,
                output_ids=output,
                logprobs=logprobs,
                weight_version=version,
                finish_reason="stop",
                actor=actor,
                engine="torch" if actor == "student" else "",
            )
        )
        await run.emit(
            ev.EpisodeFinished(
                run_id=run.run_id,
                episode_id=episode,
                stop_reason=ev.StopReason.SUBMITTED,
                n_turns=1,
            )
        )
        await run.emit(ev.RewardAssigned(run_id=run.run_id, episode_id=episode, reward=r))


async def main(args: argparse.Namespace) -> dict[str, object]:
    cfg = TrainerConfig(
        algorithm=args.algorithm,
        steps=args.iterations - 1,
        lr=args.lr,
        mode="sync",
        batch_groups=args.prompts,
        batch_episodes=args.prompts * args.demos,
        device=args.device,
        trainable=args.trainable,
        max_tokens=4096,
        keep_last=2,
        max_grad_norm=1.0,
        filter="actor = 'oracle'" if args.algorithm == "sft" else "",
    )
    engine = TorchEngine(args.model, device=args.device, max_len=1024)
    started = time.time()
    curve: list[float] = []
    try:
        async with RunContext(
            args.run_dir, recipe="learning_curve", config={"trainer": msgspec.to_builtins(cfg)}
        ) as run:
            run.spawn(WeightSync(engine, label="engine0"))
            run.spawn(Trainer(cfg))
            for it in range(args.iterations):
                last = it == args.iterations - 1
                demos = args.demos if args.algorithm == "sft" and not last else 0
                rate = await iteration(run, engine, it, args, demos)
                curve.append(rate)
                print(
                    f"iteration {it}: weight_version {engine.weight_version} "
                    f"reward {rate:.3f} ({time.time() - started:.0f}s)",
                    flush=True,
                )
                if it < args.iterations - 1:
                    # sync mode: wait for the next version (the engine exposes no event to await)
                    while engine.weight_version < it + 1:  # noqa: ASYNC110
                        await asyncio.sleep(0.2)
            table = await run.query(CURVE_SQL)
    finally:
        await engine.close()
    rows = table.to_pylist()
    print(CURVE_SQL)
    for r in rows:
        print(r)
    first, last = rows[0]["reward_mean"], rows[-1]["reward_mean"]
    return {
        "algorithm": args.algorithm,
        "first": first,
        "last": last,
        "gain": round(last - first, 3),
        "versions": len(rows),
        "seconds": round(time.time() - started, 1),
        "run_dir": str(args.run_dir),
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--algorithm", choices=["grpo", "sft"], default="grpo")
    p.add_argument(
        "--task",
        choices=["target", "short"],
        default="target",
        help="reward: the target answer appears | the answer ends within the budget",
    )
    p.add_argument(
        "--iterations", type=int, default=6, help="sampling rounds (trains between them)"
    )
    p.add_argument("--prompts", type=int, default=4, help=f"at most {len(PROMPTS)}")
    p.add_argument("--samples", type=int, default=8, help="samples per prompt (group size)")
    p.add_argument("--demos", type=int, default=2, help="sft: oracle demonstrations per prompt")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--trainable", default="", help="regex of parameters to train ('' = all)")
    p.add_argument("--model", default="default")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse()))))

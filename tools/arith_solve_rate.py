"""How often a model solves the bundled arith tiers with the ReTool agent: the same agent loop
(stacx.agents.retool), the torch engine, the process sandbox and the answer verifier that a
recipe uses, on a few problems per tier. Prints one JSON object as its last line.

    flock /tmp/heavy.lock .venv/bin/python tools/arith_solve_rate.py --n 20 --temperature 0

It is a probe of the model on the task set (is there a reward signal for GRPO to learn from?),
not a second launcher: it records no run. Once `sandbox.backend = "process"` is wired into the
launcher, `stacx run recipes/retool/eval_tiny.toml` gives the same figure through the front door.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stacx.agents.chat import ChatFormat  # noqa: E402
from stacx.agents.policies import EnginePolicy, always  # noqa: E402
from stacx.agents.retool import RetoolConfig, retool_agents  # noqa: E402
from stacx.events import Event, ToolCalled  # noqa: E402
from stacx.inference.torch_engine import TorchEngine  # noqa: E402
from stacx.ports import Task  # noqa: E402
from stacx.sandbox.answers import verify_answer  # noqa: E402
from stacx.sandbox.process import ProcessSandbox  # noqa: E402
from stacx.sandbox.tasks import load_tasks, select, task_limits  # noqa: E402
from stacx.sandbox.verifier import VerifierResult  # noqa: E402


async def main(args: argparse.Namespace) -> dict[str, object]:
    tasks = load_tasks(ROOT / "recipes" / "tasks" / "math")
    t0 = time.perf_counter()
    engine = TorchEngine(args.model, device="cpu", max_batch=args.samples)
    assert engine.tokenizer is not None
    chat = ChatFormat(engine.tokenizer)
    config = RetoolConfig(
        max_turns=args.max_turns,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        seed=0,
        style=args.style,
    )
    make_agent = retool_agents(chat, config, lambda _t, _i: always(EnginePolicy(engine)))
    per_tier: dict[str, list[float]] = defaultdict(list)
    used_python: dict[str, int] = defaultdict(int)
    examples: dict[str, list[str]] = defaultdict(list)
    for tier in args.tiers.split(","):
        chosen = select(tasks, include=[f"{args.split}-*"], difficulty=[tier], limit=args.n)

        async def one(task: Task, sample: int, tier: str = tier) -> None:
            events: list[Event] = []

            async def emit(e: Event) -> None:
                events.append(e)

            async with ProcessSandbox(task_limits(task)) as sandbox:
                result = await make_agent(task, sample).run(
                    run_id="probe",
                    episode_id=f"{task.task_id}-{sample}",
                    instruction=task.instruction,
                    sandbox=sandbox,
                    emit=emit,
                )
                outcome = await verify_answer(sandbox, task)
            assert isinstance(outcome, VerifierResult)
            per_tier[tier].append(outcome.reward)
            used_python[tier] += any(
                isinstance(e, ToolCalled) and e.tool == "python" for e in events
            )
            if len(examples[tier]) < 3:
                text = chat.decode(result.transcript_ids[-200:])
                examples[tier].append(f"{task.instruction} -> {outcome.output!r}: {text[-160:]!r}")

        jobs = [one(t, s) for t in chosen for s in range(args.samples)]
        await asyncio.gather(*jobs)
    await engine.close()
    return {
        "model": args.model,
        "split": args.split,
        "samples_per_problem": args.samples,
        "temperature": args.temperature,
        "max_new_tokens": args.max_new_tokens,
        "max_turns": args.max_turns,
        "style": args.style,
        "solve_rate": {t: round(sum(r) / len(r), 3) for t, r in per_tier.items()},
        "episodes": {t: len(r) for t, r in per_tier.items()},
        "episodes_with_python": dict(used_python),
        "examples": dict(examples),
        "seconds": round(time.perf_counter() - t0, 1),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}",
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default")
    p.add_argument("--tiers", default="trivial,easy,medium")
    p.add_argument("--split", default="heldout", choices=["train", "heldout"])
    p.add_argument("--n", type=int, default=10, help="problems per tier")
    p.add_argument("--samples", type=int, default=1, help="samples per problem")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--max-turns", type=int, default=2)
    p.add_argument("--style", default="python", choices=["python", "tool_call"])
    out = asyncio.run(main(p.parse_args()))
    print(json.dumps(out))

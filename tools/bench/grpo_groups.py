"""GRPO step with shared prompts vs the plain packed step (trainer.share_prompts).

A GRPO batch holds n completions of each prompt. The plain step forwards every (prompt +
completion) sequence; the shared step (stacx.train.packing.pack_shared) forwards each prompt
once and the completions as branches that attend to it. Same loss and update (tested in
tests/train/test_packing.py); this measures the cost.

Batch: quickstart-shaped by default — 4 groups x 8 samples, a 250-token prompt, completions of
8..40 tokens (what the bundled tasks' bash format produces), the default model (SmolLM2-135M),
last 4 layers + norm trainable, as the quickstart trains on CPU. The two variants alternate,
after a warm-up step each; the median step time is reported.

    python tools/bench/grpo_groups.py [--groups 4] [--group-size 8] [--prompt 250] [--steps 3]

Last line: one JSON object {plain_step_s, shared_step_s, speedup, plain_positions,
shared_positions}.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

from stacx.hf import load_hf_model
from stacx.train.config import TrainerConfig
from stacx.train.packing import Sample, shared_positions
from stacx.train.step import make_optimizer, train_step, trainable_parameters


def batch(args: argparse.Namespace, vocab: int) -> list[Sample]:
    rng = random.Random(args.seed)
    samples = []
    for _ in range(args.groups):
        prompt = [rng.randrange(vocab) for _ in range(args.prompt)]
        for _ in range(args.group_size):
            n = rng.randint(8, 40)
            samples.append(
                Sample(
                    prompt,
                    [rng.randrange(vocab) for _ in range(n)],
                    {"behavior_logprobs": [-2.0] * n, "advantages": [rng.gauss(0, 1)] * n},
                )
            )
    return samples


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=250)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--trainable", default=r"^model\.(norm|layers\.(2[6-9]))\.")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    model, _, _ = load_hf_model("default", torch.device("cpu"), torch.float32)
    samples = batch(args, int(model.config.vocab_size))
    params = trainable_parameters(model, args.trainable)
    cfgs = {
        share: TrainerConfig(algorithm="grpo", lr=1e-7, max_tokens=2048, share_prompts=share)
        for share in (False, True)
    }
    opts = {share: make_optimizer(cfgs[share], params) for share in cfgs}
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(args.steps + 1):  # step 0 is the warm-up
        for share in (False, True):
            t0 = time.perf_counter()
            train_step(cfgs[share], model, opts[share], samples, i + 1)
            if i:
                times[share].append(time.perf_counter() - t0)
    plain, shared = statistics.median(times[False]), statistics.median(times[True])
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, samples {len(samples)}")
    print(
        json.dumps(
            {
                "plain_step_s": round(plain, 2),
                "shared_step_s": round(shared, 2),
                "speedup": round(plain / shared, 2),
                "plain_positions": sum(s.n_positions for s in samples),
                "shared_positions": shared_positions(samples),
            }
        )
    )


if __name__ == "__main__":
    main()

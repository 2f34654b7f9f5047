"""The torch engine's warm-up before it serves (`TorchEngine.warm_up`): which requests build the
decode step's kernels and capture the CUDA graphs a first pass would otherwise meet.
Design: docs/engine.md#the-gpu-decode-step
"""

from __future__ import annotations

import random
from typing import NamedTuple

import msgspec

from stacx.inference.cuda_graphs import BATCH_BUCKETS, PREFILL_BUCKETS
from stacx.ports import SamplingParams


class WarmUp(NamedTuple):
    """What `TorchEngine.warm_up` ran: its seconds, requests and generated tokens."""

    seconds: float
    requests: int
    tokens: int


def warm_up_plan(
    max_batch: int, max_len: int, decode_steps: int, vocab: int, pool_tokens: int = 0
) -> list[tuple[list[list[int]], SamplingParams]]:
    """`TorchEngine.warm_up`'s generate calls, in order: one prompt per prefill piece bucket (its
    graph and the prefill kernels), then at every batch bucket up to `max_batch` rows of short
    prompts, greedy and sampled, each reply two multi-step replays long (the decode graphs and
    every row tile's kernels), then one row and the most rows that fit half of a `pool_tokens`
    pool (0: no pool) at a long context (the attention's split path). No row is longer than half
    that pool. Random prompts (seeded), so no row reuses another's prefix."""
    steps = 2 * decode_steps
    draw = random.Random(0)

    def prompts(rows: int, length: int) -> list[list[int]]:
        return [[draw.randrange(1, vocab) for _ in range(length)] for _ in range(rows)]

    greedy = SamplingParams(max_new_tokens=steps, temperature=0.0, ignore_eos=True)
    sampled = SamplingParams(max_new_tokens=steps, temperature=1.0, seed=0, ignore_eos=True)
    # a row's positions: under the context limit, and within half a paged pool (block rounding)
    most = min(max_len, pool_tokens // 2) if pool_tokens else max_len
    plan = [
        (prompts(1, n), msgspec.structs.replace(greedy, max_new_tokens=1))
        for n in PREFILL_BUCKETS
        if n <= most - 2
    ]
    batches = [b for b in BATCH_BUCKETS if b <= max_batch]
    for b in batches:
        plan += [(prompts(b, 16), greedy), (prompts(b, 16), sampled)]
    long = min(PREFILL_BUCKETS[-1], most - steps - 1)  # a prompt that leaves the reply room
    if long > 16:
        fit = [b for b in batches if not pool_tokens or b * (long + steps) <= pool_tokens // 2]
        plan += [(prompts(b, long), greedy) for b in sorted({1, fit[-1] if fit else 1})]
    return plan

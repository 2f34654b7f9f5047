"""The torch engine's warm-up before it serves (`TorchEngine.warm_up`): which requests build the
decode step's kernels and capture the CUDA graphs a first pass would otherwise meet.
Design: docs/engine.md#the-gpu-decode-step
"""

from __future__ import annotations

import random
from collections.abc import Callable
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
    max_batch: int,
    max_len: int,
    decode_steps: int,
    vocab: int,
    pool_tokens: int = 0,
    long_keys: Callable[[int], int] | None = None,
) -> list[tuple[list[list[int]], SamplingParams]]:
    """`TorchEngine.warm_up`'s generate calls, in order: one prompt per prefill piece bucket (its
    graph and the prefill kernels), then at every batch bucket up to `max_batch` rows of short
    prompts, greedy and sampled, each reply two multi-step replays long (the decode graphs and
    every row tile's kernels), and the same at ``long_keys(b)`` keys, where b rows' decode graphs
    take the shape every longer context shares (the Triton step's most key splits,
    `triton_attention.most_splits_keys`; None: no long prompts). No row is longer than the
    context limit allows, and the rows of a call hold at most half of a `pool_tokens` pool (0:
    no pool). Random prompts (seeded), so no row reuses another's prefix."""
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
    for b in (b for b in BATCH_BUCKETS if b <= max_batch):
        plan += [(prompts(b, 16), greedy), (prompts(b, 16), sampled)]
        share = min(most, pool_tokens // 2 // b) if pool_tokens else most  # a row's positions
        long = min(long_keys(b) if long_keys else 0, share - steps - 1)
        if long > 16:
            plan += [(prompts(b, long), greedy), (prompts(b, long), sampled)]
    return plan

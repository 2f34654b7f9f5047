"""Torch oracles of the advantages the SQL views compute (grpo_batch, aggrevate_dataset): the
tests check the views against these; the trainer never calls them (one implementation each)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from stacx.train.advantages import AdvantageInputError
from stacx.train.packing import Sample


def group_index(group_ids: Sequence[str]) -> Tensor:
    """Dense int64 indices (0..G-1, in order of first appearance) for string group ids."""
    seen: dict[str, int] = {}
    return torch.tensor([seen.setdefault(g, len(seen)) for g in group_ids], dtype=torch.long)


def _group_stats(values_N: Tensor, group_N: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-element group size, group mean and group sample std (exactly 0 for groups of one
    and for groups whose values are all equal)."""
    if values_N.ndim != 1 or values_N.shape != group_N.shape:
        raise AdvantageInputError(
            f"values and group indices must be 1-D of one length, got "
            f"{tuple(values_N.shape)} and {tuple(group_N.shape)}"
        )
    if group_N.numel() and int(group_N.min()) < 0:
        raise AdvantageInputError("group indices must be >= 0")
    n_groups = int(group_N.max()) + 1 if group_N.numel() else 0
    values = values_N.to(torch.float64)
    size_G = torch.zeros(n_groups, dtype=torch.float64).index_add_(
        0, group_N, torch.ones_like(values)
    )
    mean_G = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_N, values) / size_G
    centered_N = values - mean_G[group_N]
    sq_G = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_N, centered_N**2)
    var_G = torch.where(size_G > 1, sq_G / (size_G - 1).clamp(min=1), torch.zeros_like(sq_G))
    # Groups whose rewards are all equal: the fp64 mean of equal floats can be off by one ulp,
    # so "spread == 0" is decided from min == max, not from the std.
    max_G = torch.full((n_groups,), -torch.inf, dtype=torch.float64).scatter_reduce(
        0, group_N, values, reduce="amax"
    )
    min_G = torch.full((n_groups,), torch.inf, dtype=torch.float64).scatter_reduce(
        0, group_N, values, reduce="amin"
    )
    std_G = torch.where(max_G > min_G, var_G.sqrt(), torch.zeros_like(var_G))
    return size_G[group_N], mean_G[group_N], std_G[group_N]


def group_advantages(
    rewards_N: Tensor,
    group_N: Tensor,
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """GRPO advantages, one per episode: ``r - mean_g`` or ``(r - mean_g) / (std_g + eps)``.

    ``std_g`` is the sample (unbiased, ``n - 1``) standard deviation of the group. A group with
    all rewards equal has advantage exactly 0 (``r - mean_g`` is computed in
    fp64 but then forced to 0, since a mean of equal floats may be one ulp off), so its advantage
    is 0 with or without normalization. Computed in fp64, returned in the rewards' dtype.
    """
    if eps <= 0:
        raise AdvantageInputError(f"eps must be > 0, got {eps}")
    _, mean_N, std_N = _group_stats(rewards_N, group_N)
    centered_N = rewards_N.to(torch.float64) - mean_N
    # Exact zero for all-equal groups even if the mean picked up rounding error.
    centered_N = torch.where(std_N > 0, centered_N, torch.zeros_like(centered_N))
    advantages_N = centered_N / (std_N + eps) if normalize_std else centered_N
    return advantages_N.to(rewards_N.dtype)


def aggrevate_advantages(cost_to_go_N: Tensor, state_N: Tensor) -> Tensor:
    """AggreVaTe per-action advantages: ``-(Q(s, a) - mean_{a'} Q(s, a'))``.

    ``state_N`` indexes the (parent episode, turn) state each branch explored. A state with a
    single explored action gets advantage 0 (no comparison is possible)."""
    return -group_advantages(cost_to_go_N, state_N, normalize_std=False)


def episode_sequences(samples: Sequence[Sample], keys: Sequence[object]) -> list[Sample]:
    """The oracle of the trainer's chain merge (``stacx.train.batches.chain_sequences``):
    consecutive samples with one key (an episode, or an (episode, chain_turn)) merged while
    each whole prompt extends the sequence so far token-exactly; the ids in between are
    prompt ids (loss mask 0, values 0)."""
    out: list[Sample] = []
    ids: list[int] = []
    n_prompt, mask, values, current = 0, [], {}, None  # type: ignore[var-annotated]

    def flush() -> None:
        if ids:
            out.append(Sample(ids[:n_prompt], ids[n_prompt:], dict(values), mask))

    for s, key in zip(samples, keys, strict=True):
        prompt = [int(x) for x in s.prompt_ids]
        if ids and key == current and prompt[: len(ids)] == ids:
            gap = len(prompt) - len(ids)
            ids, mask = ids + prompt[len(ids) :], mask + [0] * gap
            values = {k: v + [0.0] * gap for k, v in values.items()}
        else:
            flush()
            ids, n_prompt, mask, current = prompt, len(prompt), [], key
            values = {k: [] for k in s.token_values}
        out_ids = [int(x) for x in s.completion_ids]
        ids = ids + out_ids
        mask = mask + ([1] * len(out_ids) if s.loss_mask is None else [int(m) for m in s.loss_mask])
        values = {k: v + [float(x) for x in s.token_values[k]] for k, v in values.items()}
    flush()
    return out

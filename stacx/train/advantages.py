"""Advantages of every STACX algorithm, as pure torch functions.

- GRPO: :func:`group_advantages` — reward minus the group's mean, optionally divided by the
  group's sample standard deviation (``std + eps``). The SQL view ``grpo_batch`` computes the same
  numbers with window functions (``avg`` and ``stddev_samp``); tests check they agree.
- OPD: :func:`opd_advantages` — per token ``teacher logprob - student logprob`` (the negative of the
  per-token reverse-KL estimate), optionally summed over the later tokens of the turn with a
  discount (``discount = 1``: the sequence-level reverse KL's return-to-go, see
  :func:`discounted_returns`), optionally plus ``coef * GRPO advantage``.
- AggreVaTe: :func:`aggrevate_advantages` — ``-(Q(s,a) - mean over a' of Q(s,a'))`` with ``Q`` the
  estimated cost-to-go; cheaper-than-average actions get a positive advantage.

Guarantees: a group where every reward is equal (and a group of one) gets advantage exactly 0,
never NaN; masked-out tokens get advantage exactly 0. Groups are given as dense integer indices
(:func:`group_index` maps string ids to them).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from stacx.errors import StacxError


class AdvantageInputError(StacxError):
    """Inputs to an advantage function disagree in shape or are out of range."""


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


def opd_advantages(
    teacher_logprobs_B_T: Tensor,
    student_logprobs_B_T: Tensor,
    loss_mask_B_T: Tensor,
    *,
    grpo_advantages_B_T: Tensor | None = None,
    grpo_coef: float = 0.0,
    discount: float = 0.0,
    center: bool = False,
) -> Tensor:
    """On-policy distillation advantages per token: ``teacher - student`` logprob of the sampled
    token (with ``discount > 0``: its discounted sum over this and the later masked tokens),
    plus ``grpo_coef * grpo_advantage`` when given (the episode's GRPO advantage broadcast over
    its tokens). Zero where the mask is unset (prompt, tool output, padding), even if the inputs
    hold NaN there.

    ``discount = 0`` scores each token by its own log ratio only (greedy per token: a token that
    leads to tokens the teacher rejects is not charged for them); ``discount = 1`` is the
    score-function gradient of the whole turn's reverse KL. ``center`` subtracts the mean of
    those values over every masked token of the batch (a baseline: the average log ratio is
    negative, and left in it pushes every sampled token down), before the GRPO term."""
    shapes = {tuple(teacher_logprobs_B_T.shape), tuple(student_logprobs_B_T.shape)}
    shapes.add(tuple(loss_mask_B_T.shape))
    if grpo_advantages_B_T is not None:
        shapes.add(tuple(grpo_advantages_B_T.shape))
    if len(shapes) != 1:
        raise AdvantageInputError(f"OPD inputs must have one shape, got {sorted(shapes)}")
    advantages = teacher_logprobs_B_T - student_logprobs_B_T
    mask = loss_mask_B_T.bool()
    if discount != 0.0:
        advantages = discounted_returns(advantages, loss_mask_B_T, discount)
    if center and mask.any():
        advantages = advantages - advantages[mask].mean()
    if grpo_advantages_B_T is not None and grpo_coef != 0.0:
        advantages = advantages + grpo_coef * grpo_advantages_B_T
    return torch.where(mask, advantages, torch.zeros_like(advantages)).detach()


def discounted_returns(values_B_T: Tensor, mask_B_T: Tensor, discount: float) -> Tensor:
    """``R[t] = v[t] + discount * R[t']`` with ``t'`` the next masked position of the row (0 past
    the last); unmasked positions get 0 and neither add nor break the chain."""
    if not 0.0 <= discount <= 1.0:
        raise AdvantageInputError(f"discount = {discount}: accepted values are in [0, 1]")
    if values_B_T.shape != mask_B_T.shape:
        raise AdvantageInputError(
            f"values {tuple(values_B_T.shape)} and mask {tuple(mask_B_T.shape)} differ in shape"
        )
    mask = mask_B_T.bool()
    values = torch.where(mask, values_B_T, torch.zeros_like(values_B_T))
    out = torch.zeros_like(values)
    running = torch.zeros_like(values[:, 0])
    for t in range(values.shape[1] - 1, -1, -1):
        running = torch.where(mask[:, t], values[:, t] + discount * running, running)
        out[:, t] = torch.where(mask[:, t], running, torch.zeros_like(running))
    return out

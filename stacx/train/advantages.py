"""OPD advantages, as pure torch functions. One implementation per algorithm's advantage:

- GRPO and AggreVaTe: in SQL, the views ``grpo_batch`` (reward minus the group's mean, over the
  group's sample std with ``normalize_std``) and ``aggrevate_dataset`` (``-(Q - mean Q)`` per
  state); torch versions of both exist only as the tests' oracles (tests/train/oracles.py).
- OPD: the per-token ``teacher logprob - student logprob`` (the negative of the per-token
  reverse-KL estimate) is the view ``opd_batch``'s ``advantages`` column, its one definition;
  :func:`opd_advantages` applies the knobs to it: summed over the later tokens of the turn
  with a discount (``discount = 1``: the sequence-level reverse KL's return-to-go, see
  :func:`discounted_returns`), centred, plus ``coef * GRPO advantage``.

Guarantees: masked-out tokens get advantage exactly 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from stacx.errors import StacxError


class AdvantageInputError(StacxError):
    """Inputs to an advantage function disagree in shape or are out of range."""


def opd_advantages(
    log_ratio_B_T: Tensor,
    loss_mask_B_T: Tensor,
    *,
    grpo_advantages_B_T: Tensor | None = None,
    grpo_coef: float = 0.0,
    discount: float = 0.0,
    center: bool = False,
) -> Tensor:
    """On-policy distillation advantages per token from ``log_ratio`` (``opd_batch.advantages``:
    ``teacher - student`` logprob of the sampled token); with ``discount > 0`` its discounted
    sum over this and the later masked tokens,
    plus ``grpo_coef * grpo_advantage`` when given (the episode's GRPO advantage broadcast over
    its tokens). Zero where the mask is unset (prompt, tool output, padding), even if the inputs
    hold NaN there.

    ``discount = 0`` scores each token by its own log ratio only (greedy per token: a token that
    leads to tokens the teacher rejects is not charged for them); ``discount = 1`` is the
    score-function gradient of the whole turn's reverse KL. ``center`` subtracts the mean of
    those values over every masked token of the batch (a baseline: the average log ratio is
    negative, and left in it pushes every sampled token down), before the GRPO term."""
    shapes = {tuple(log_ratio_B_T.shape), tuple(loss_mask_B_T.shape)}
    if grpo_advantages_B_T is not None:
        shapes.add(tuple(grpo_advantages_B_T.shape))
    if len(shapes) != 1:
        raise AdvantageInputError(f"OPD inputs must have one shape, got {sorted(shapes)}")
    advantages = log_ratio_B_T
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

"""OPD advantages, as pure torch functions (GRPO's and AggreVaTe's are SQL views; their torch
versions are the tests' oracles). Guarantees: masked-out tokens get exactly 0.
Design: docs/training.md#the-model-and-the-step
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
    """OPD advantages per token from ``log_ratio`` (``opd_batch.advantages``): discounted over later
    masked tokens, centred with ``center``, plus ``grpo_coef * grpo_advantage``; 0 off the mask."""
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
    """``R[t] = v[t] + discount * R[t']``, ``t'`` the row's next masked position; unmasked positions
    get 0 and do not break the chain."""
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

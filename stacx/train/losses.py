"""Per-token losses of every STACX algorithm, as pure torch functions: SFT/DAgger cross-entropy, the
clipped policy gradient of GRPO/OPD (truncated IS, IcePop band) and AggreVaTe's advantage-weighted
NLL, all token-level means over aligned ``*_B_T`` tensors (padded ``[B, T]`` or a packed ``[1, T]``
row); an empty mask gives exactly 0, never NaN. Knows nothing about models, batches or the log.
Design: docs/training.md#losses
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from stacx.errors import StacxError


class LossInputError(StacxError):
    """Tensors passed to a loss disagree in shape, dtype or value range."""


def _same_shape(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise LossInputError(f"per-token tensors must have one shape, got {shapes}")


def masked_mean(
    values_B_T: Tensor, loss_mask_B_T: Tensor, normalizer: float | None = None
) -> Tensor:
    """``sum(values * mask) / count`` (masked tokens, or ``normalizer``); 0 for an empty mask.
    Masked-out NaN or inf never reach the sum or its gradient (selected away with ``where``)."""
    _same_shape(values=values_B_T, loss_mask=loss_mask_B_T)
    keep = loss_mask_B_T.bool()
    total = torch.where(keep, values_B_T, torch.zeros_like(values_B_T)).sum()
    if normalizer is not None:
        if normalizer <= 0:
            raise LossInputError(f"normalizer must be > 0, got {normalizer}")
        return total / normalizer
    return total / keep.sum().clamp(min=1).to(total.dtype)


def _stats_dtype(x: Tensor) -> torch.dtype:
    """Softmax statistics in fp32 at least (fp64 inputs keep fp64, for reference checks)."""
    return torch.promote_types(x.dtype, torch.float32)


def token_logprobs(logits_B_T_V: Tensor, targets_B_T: Tensor) -> Tensor:
    """``log softmax(logits)[target]`` in fp32 (fp64 for fp64), for logits that already exist."""
    if logits_B_T_V.shape[:-1] != targets_B_T.shape:
        raise LossInputError(
            f"logits {tuple(logits_B_T_V.shape)} and targets {tuple(targets_B_T.shape)} disagree"
        )
    logits = logits_B_T_V.to(_stats_dtype(logits_B_T_V))
    picked = logits.gather(-1, targets_B_T.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


class _ChunkedTokenLogprobs(torch.autograd.Function):
    """Logprobs of targets under ``softmax(hidden @ weight.T)``, chunk by chunk: forward keeps only
    the per-token log-sum-exp; backward recomputes each chunk's logits."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        hidden_N_H: Tensor,
        weight_V_H: Tensor,
        targets_N: Tensor,
        chunk_tokens: int,
    ) -> Tensor:
        n = hidden_N_H.shape[0]
        stats = _stats_dtype(hidden_N_H)
        logprobs_N = torch.empty(n, dtype=stats, device=hidden_N_H.device)
        lse_N = torch.empty(n, dtype=stats, device=hidden_N_H.device)
        for start in range(0, n, chunk_tokens):
            end = min(start + chunk_tokens, n)
            logits_C_V = (hidden_N_H[start:end] @ weight_V_H.T).to(stats)
            lse_C = torch.logsumexp(logits_C_V, dim=-1)
            picked_C = logits_C_V.gather(1, targets_N[start:end, None]).squeeze(1)
            logprobs_N[start:end] = picked_C - lse_C
            lse_N[start:end] = lse_C
        ctx.save_for_backward(hidden_N_H, weight_V_H, targets_N, lse_N)
        ctx.chunk_tokens = chunk_tokens  # type: ignore[attr-defined]
        return logprobs_N

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad_N: Tensor
    ) -> tuple[Tensor | None, Tensor | None, None, None]:
        hidden_N_H, weight_V_H, targets_N, lse_N = ctx.saved_tensors  # type: ignore[attr-defined]
        chunk_tokens: int = ctx.chunk_tokens  # type: ignore[attr-defined]
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]  # type: ignore[attr-defined]
        grad_hidden = torch.empty_like(hidden_N_H) if need_hidden else None
        stats = lse_N.dtype
        # fp32 accumulator: summing bf16 partial products over many chunks would lose precision.
        grad_weight = torch.zeros_like(weight_V_H, dtype=stats) if need_weight else None
        grad_N = grad_N.to(stats)
        for start in range(0, hidden_N_H.shape[0], chunk_tokens):
            end = min(start + chunk_tokens, hidden_N_H.shape[0])
            h_C_H = hidden_N_H[start:end]
            g_C = grad_N[start:end]
            # grad wrt logits = g * (onehot - softmax), built in the logits buffer.
            grad_logits_C_V = (h_C_H @ weight_V_H.T).to(stats)
            grad_logits_C_V.sub_(lse_N[start:end, None]).exp_().mul_(-g_C[:, None])
            grad_logits_C_V.scatter_add_(1, targets_N[start:end, None], g_C[:, None])
            grad_logits_C_V = grad_logits_C_V.to(hidden_N_H.dtype)
            if grad_hidden is not None:
                grad_hidden[start:end] = grad_logits_C_V @ weight_V_H
            if grad_weight is not None:
                grad_weight.addmm_(grad_logits_C_V.T.to(stats), h_C_H.to(stats))
        grad_weight_out = grad_weight.to(weight_V_H.dtype) if grad_weight is not None else None
        return grad_hidden, grad_weight_out, None, None


def chunked_token_logprobs(
    hidden_N_H: Tensor, weight_V_H: Tensor, targets_N: Tensor, chunk_tokens: int = 2048
) -> Tensor:
    """Logprob of each target under ``log_softmax(hidden @ weight.T)``, differentiable in both,
    without materializing the ``N x V`` logits.

    ``hidden_N_H``: the final hidden states (after the last norm) of the tokens that need a logprob;
    ``weight_V_H``: the lm_head weight. Matmuls in the inputs' dtype, statistics and result in fp32
    (fp64 for fp64). One chunk peaks at about ``3 * chunk_tokens * V * 4`` bytes."""
    if hidden_N_H.ndim != 2 or weight_V_H.ndim != 2 or targets_N.ndim != 1:
        raise LossInputError(
            "chunked_token_logprobs wants hidden [N, H], weight [V, H], targets [N]; got "
            f"{tuple(hidden_N_H.shape)}, {tuple(weight_V_H.shape)}, {tuple(targets_N.shape)}"
        )
    if hidden_N_H.shape[0] != targets_N.shape[0] or hidden_N_H.shape[1] != weight_V_H.shape[1]:
        raise LossInputError(
            f"shapes disagree: hidden {tuple(hidden_N_H.shape)}, weight "
            f"{tuple(weight_V_H.shape)}, targets {tuple(targets_N.shape)}"
        )
    if chunk_tokens < 1:
        raise LossInputError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    out: Tensor = _ChunkedTokenLogprobs.apply(
        hidden_N_H, weight_V_H.to(hidden_N_H.dtype), targets_N.long(), chunk_tokens
    )
    return out


# ---- losses ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LossOutput:
    """A scalar loss and detached scalar diagnostics (tensors: reading them is one device sync)."""

    loss: Tensor
    metrics: dict[str, Tensor]


def sft_loss(
    logprobs_B_T: Tensor, loss_mask_B_T: Tensor, normalizer: float | None = None
) -> LossOutput:
    """Cross-entropy on completion tokens: ``-masked_mean(logprobs)`` (SFT, DAgger)."""
    loss = -masked_mean(logprobs_B_T, loss_mask_B_T, normalizer)
    n_tokens = loss_mask_B_T.bool().sum()
    # the mean over these tokens (a per-token mean, as the other losses' metrics are), whatever
    # the normalizer: the trainer's token-weighted average is then the batch's nll
    nll = -masked_mean(logprobs_B_T.detach(), loss_mask_B_T)
    return LossOutput(loss, {"nll": nll, "n_tokens": n_tokens})


def policy_gradient_loss(
    logprobs_B_T: Tensor,
    behavior_logprobs_B_T: Tensor,
    advantages_B_T: Tensor,
    loss_mask_B_T: Tensor,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    old_logprobs_B_T: Tensor | None = None,
    tis_cap: float | None = None,
    normalizer: float | None = None,
    mask_band: tuple[float, float] | None = None,
) -> LossOutput:
    """PPO-style clipped policy gradient (GRPO, OPD), token-level mean.

    The proximal logprobs are ``old_logprobs_B_T`` (the trainer's, before this update) when given,
    else the behavior logprobs; ``tis_cap`` and ``mask_band`` need ``old_logprobs_B_T``. Formula and
    metrics: docs/training.md#losses."""
    _same_shape(
        logprobs=logprobs_B_T,
        behavior_logprobs=behavior_logprobs_B_T,
        advantages=advantages_B_T,
        loss_mask=loss_mask_B_T,
    )
    _check_pg_options(clip_eps_low, clip_eps_high, old_logprobs_B_T is not None, tis_cap, mask_band)
    proximal_B_T = behavior_logprobs_B_T if old_logprobs_B_T is None else old_logprobs_B_T
    proximal_B_T = proximal_B_T.detach().to(logprobs_B_T.dtype)
    advantages_B_T = advantages_B_T.detach().to(logprobs_B_T.dtype)
    mask = loss_mask_B_T.bool()
    zeros_B_T = torch.zeros_like(logprobs_B_T)
    # Padding positions may hold garbage logprobs; zero the log-ratio there so exp cannot overflow.
    log_ratio_B_T = torch.where(mask, logprobs_B_T - proximal_B_T, zeros_B_T)
    ratio_B_T = torch.exp(log_ratio_B_T)
    unclipped_B_T = ratio_B_T * advantages_B_T
    clipped_B_T = ratio_B_T.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high) * advantages_B_T
    per_token_B_T = -torch.minimum(unclipped_B_T, clipped_B_T)
    per_token_B_T, weight_B_T, kept_B_T = _mismatch_weighted(
        per_token_B_T, old_logprobs_B_T, behavior_logprobs_B_T, mask, tis_cap, mask_band
    )
    loss = masked_mean(per_token_B_T, loss_mask_B_T, normalizer)
    with torch.no_grad():  # the diagnostics: per-token means over the loss mask
        clipped_taken_B_T = (clipped_B_T < unclipped_B_T).to(logprobs_B_T.dtype)
        metrics = {
            "clip_frac": masked_mean(clipped_taken_B_T, loss_mask_B_T),
            "ratio_mean": masked_mean(ratio_B_T, loss_mask_B_T),
            "approx_kl": masked_mean(-log_ratio_B_T, loss_mask_B_T),
            "tis_weight_mean": masked_mean(weight_B_T, loss_mask_B_T),
            "is_masked_frac": masked_mean(1 - kept_B_T, loss_mask_B_T),
            "n_tokens": loss_mask_B_T.bool().sum(),
        }
    return LossOutput(loss, metrics)


def _mismatch_weighted(
    per_token_B_T: Tensor,
    old_logprobs_B_T: Tensor | None,
    behavior_logprobs_B_T: Tensor,
    mask: Tensor,
    tis_cap: float | None,
    mask_band: tuple[float, float] | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The per-token loss weighted by the truncated IS ratio and zeroed outside ``mask_band``; with
    the weights and the kept tokens (ones where a correction is off)."""
    weight_B_T = kept_B_T = torch.ones_like(per_token_B_T)
    if old_logprobs_B_T is None or (tis_cap is None and mask_band is None):
        return per_token_B_T, weight_B_T, kept_B_T
    # the trainer's over the engine's probability of each token
    old_B_T = old_logprobs_B_T.detach().to(per_token_B_T.dtype)
    is_ratio_B_T = torch.exp(
        torch.where(mask, old_B_T - behavior_logprobs_B_T.detach(), torch.zeros_like(old_B_T))
    )
    if tis_cap is not None:
        weight_B_T = is_ratio_B_T.clamp(max=tis_cap)
        per_token_B_T = per_token_B_T * weight_B_T
    if mask_band is not None:
        kept_B_T = ((is_ratio_B_T >= mask_band[0]) & (is_ratio_B_T <= mask_band[1])).to(
            per_token_B_T.dtype
        )
        per_token_B_T = per_token_B_T * kept_B_T
    return per_token_B_T, weight_B_T, kept_B_T


def _check_pg_options(
    eps_low: float,
    eps_high: float,
    has_old: bool,
    tis_cap: float | None,
    mask_band: tuple[float, float] | None,
) -> None:
    if eps_low < 0 or eps_high < 0 or eps_low >= 1:
        raise LossInputError(
            f"clip eps must satisfy 0 <= eps_low < 1 and eps_high >= 0, got "
            f"eps_low={eps_low}, eps_high={eps_high}"
        )
    if mask_band is not None and not has_old:
        raise LossInputError("mask_band needs old_logprobs_B_T (the trainer's pre-update logprobs)")
    if mask_band is not None and not 0 < mask_band[0] < 1 < mask_band[1]:
        raise LossInputError(f"mask_band must satisfy 0 < low < 1 < high, got {mask_band}")
    if tis_cap is not None and not has_old:
        raise LossInputError("tis_cap needs old_logprobs_B_T (the trainer's pre-update logprobs)")


def advantage_weighted_loss(
    logprobs_B_T: Tensor,
    advantages_B_T: Tensor,
    loss_mask_B_T: Tensor,
    normalizer: float | None = None,
) -> LossOutput:
    """``-masked_mean(A * logprob)``, AggreVaTe's update (= the clipped loss at ratio 1)."""
    _same_shape(logprobs=logprobs_B_T, advantages=advantages_B_T, loss_mask=loss_mask_B_T)
    per_token = -advantages_B_T.detach().to(logprobs_B_T.dtype) * logprobs_B_T
    loss = masked_mean(per_token, loss_mask_B_T, normalizer)
    return LossOutput(loss, {"n_tokens": loss_mask_B_T.bool().sum()})

"""Per-token losses of every STACX algorithm, as pure torch functions.

All losses take *aligned* per-token tensors: position ``t`` of ``logprobs_B_T`` is the log
probability of ``targets_B_T[t]`` (the next token) under the model being trained, and
``loss_mask_B_T`` is 1 where that target is a completion (assistant) token. The ``B_T`` suffix
reads "any leading shape": a padded batch ``[B, T]`` or a packed row ``[1, T]`` (see
``stacx.train.packing``) work the same way.

Normalization (one rule, written once in :func:`masked_mean`): every loss is a *token-level
mean* — the sum of per-token losses over all masked tokens of the batch divided by the number
of masked tokens (DAPO-style; long completions weigh more than short ones, and no per-sequence
mean is taken first). Pass ``normalizer`` to divide by a fixed count instead, so that the
gradients of micro-batches accumulated over one optimizer step add up to the gradient of the
whole batch's token mean. An empty mask gives a loss of exactly 0 with zero gradients, never
NaN.

Algorithms (advantages come from ``stacx.train.advantages``):

- SFT and DAgger: ``-mean(logprob)`` over completion tokens (:func:`sft_loss`).
- GRPO and OPD: clipped-ratio policy gradient against the *behavior* logprobs stored in the log,
  with optional truncated importance sampling for stale samples (:func:`policy_gradient_loss`).
- AggreVaTe: advantage-weighted log-likelihood (:func:`advantage_weighted_loss`).

Logprobs over a large vocabulary come from :func:`chunked_token_logprobs`, which never
materializes the full ``[N, V]`` fp32 logits, in the forward or the backward pass.

What this module does not do: it knows nothing about models, batches or the log.
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


def masked_sum(values_B_T: Tensor, loss_mask_B_T: Tensor) -> Tensor:
    """Sum of ``values`` where the mask is set. Masked-out values may be anything finite *or not*:
    they are selected away with ``where``, so a NaN or inf in padding never leaks into the sum
    or its gradient."""
    _same_shape(values=values_B_T, loss_mask=loss_mask_B_T)
    keep = loss_mask_B_T.bool()
    return torch.where(keep, values_B_T, torch.zeros_like(values_B_T)).sum()


def masked_mean(
    values_B_T: Tensor, loss_mask_B_T: Tensor, normalizer: float | None = None
) -> Tensor:
    """Token-level mean: ``sum(values * mask) / count`` where ``count`` is the number of masked
    tokens (or ``normalizer`` when given). ``count == 0`` gives 0, not NaN."""
    total = masked_sum(values_B_T, loss_mask_B_T)
    if normalizer is not None:
        if normalizer <= 0:
            raise LossInputError(f"normalizer must be > 0, got {normalizer}")
        return total / normalizer
    count = loss_mask_B_T.bool().sum()
    return total / count.clamp(min=1).to(total.dtype)


def _stats_dtype(x: Tensor) -> torch.dtype:
    """Softmax statistics in fp32 at least (fp64 inputs keep fp64, for reference checks)."""
    return torch.promote_types(x.dtype, torch.float32)


def token_logprobs(logits_B_T_V: Tensor, targets_B_T: Tensor) -> Tensor:
    """``log softmax(logits)[target]`` in fp32 (fp64 for fp64 logits), for logits that already
    exist (small vocab, tests). Use :func:`chunked_token_logprobs` when they would be large."""
    if logits_B_T_V.shape[:-1] != targets_B_T.shape:
        raise LossInputError(
            f"logits {tuple(logits_B_T_V.shape)} and targets {tuple(targets_B_T.shape)} disagree"
        )
    logits = logits_B_T_V.to(_stats_dtype(logits_B_T_V))
    picked = logits.gather(-1, targets_B_T.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


class _ChunkedTokenLogprobs(torch.autograd.Function):
    """Logprobs of targets under ``softmax(hidden @ weight.T)``, computed chunk by chunk.

    Forward keeps only the per-token log-sum-exp (N floats); backward recomputes each chunk's
    logits and forms ``d logprob / d logits = onehot(target) - softmax`` in place. Peak extra
    memory is a few ``[chunk, V]`` fp32 buffers plus an fp32 ``[V, H]`` gradient accumulator.
    """

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
    """Logprob of each target under ``log_softmax(hidden @ weight.T)``, differentiable in
    ``hidden`` and ``weight``, without materializing all ``N x V`` logits.

    ``hidden_N_H`` is the final hidden state (after the model's last norm) of only the tokens
    that need a logprob; ``weight_V_H`` is the lm_head (or tied embedding) weight. Matmuls run
    in the inputs' dtype (bf16 on GPU); softmax statistics are fp32 (fp64 for fp64 inputs), and
    so is the returned ``[N]`` tensor.
    ``chunk_tokens`` bounds memory: one chunk costs about ``3 * chunk_tokens * V * 4`` bytes
    at peak (152k vocab, 2048 tokens: ~3.7 GB).
    """
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
    """A scalar loss to backpropagate and detached scalar diagnostics (tensors, so that reading
    them costs one device sync, when the trainer chooses)."""

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

    Per token, with ``ratio = exp(logprob - proximal)``::

        loss_t = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A) * w

    The proximal logprobs are ``old_logprobs_B_T`` (the trainer's own logprobs before this
    update) when given, else the behavior logprobs the engine recorded when it sampled.
    Truncated importance sampling (``tis_cap``, requires ``old_logprobs_B_T``) corrects for the
    engine/trainer mismatch and staleness: ``w = min(exp(old - behavior), tis_cap)``, a
    constant (no gradient). Without it ``w = 1``. Token masking (``mask_band = (low, high)``,
    IcePop-style, requires ``old_logprobs_B_T``): a token whose ratio ``exp(old - behavior)``
    leaves ``[low, high]`` (the engine's and the trainer's probabilities disagree: a stale or
    mismatched token) gets weight 0; it still counts in the normalizer, as a masked-out token of
    the mean would not: ``is_masked_frac`` reports the share.

    Metrics: ``clip_frac`` (share of masked tokens whose clipped branch was taken), ``ratio_mean``,
    ``approx_kl`` (``mean(proximal - logprob)``), ``tis_weight_mean``.
    """
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
    with torch.no_grad():
        clipped_taken_B_T = (clipped_B_T < unclipped_B_T).to(logprobs_B_T.dtype)
        metrics = _pg_metrics(
            loss_mask_B_T, clipped_taken_B_T, ratio_B_T, log_ratio_B_T, weight_B_T, kept_B_T
        )
    return LossOutput(loss, metrics)


def _mismatch_weighted(
    per_token_B_T: Tensor,
    old_logprobs_B_T: Tensor | None,
    behavior_logprobs_B_T: Tensor,
    mask: Tensor,
    tis_cap: float | None,
    mask_band: tuple[float, float] | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The per-token loss corrected for the engine/trainer mismatch: weighted by the truncated
    importance ratio (``tis_cap``) and zeroed outside ``mask_band``; with the weights and the
    kept tokens (ones where a correction is off)."""
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


def _pg_metrics(
    loss_mask_B_T: Tensor,
    clipped_taken_B_T: Tensor,
    ratio_B_T: Tensor,
    log_ratio_B_T: Tensor,
    weight_B_T: Tensor,
    kept_B_T: Tensor,
) -> dict[str, Tensor]:
    """`policy_gradient_loss`'s diagnostics: per-token means over the loss mask."""
    return {
        "clip_frac": masked_mean(clipped_taken_B_T, loss_mask_B_T),
        "ratio_mean": masked_mean(ratio_B_T, loss_mask_B_T),
        "approx_kl": masked_mean(-log_ratio_B_T, loss_mask_B_T),
        "tis_weight_mean": masked_mean(weight_B_T, loss_mask_B_T),
        "is_masked_frac": masked_mean(1 - kept_B_T, loss_mask_B_T),
        "n_tokens": loss_mask_B_T.bool().sum(),
    }


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
    """Advantage-weighted log-likelihood, ``-masked_mean(A * logprob)`` (AggreVaTe's
    cost-sensitive update: actions with a lower cost-to-go than the state's mean are pushed up,
    the others down). Its gradient equals the clipped loss's at ratio 1 (on-policy)."""
    _same_shape(logprobs=logprobs_B_T, advantages=advantages_B_T, loss_mask=loss_mask_B_T)
    per_token = -advantages_B_T.detach().to(logprobs_B_T.dtype) * logprobs_B_T
    loss = masked_mean(per_token, loss_mask_B_T, normalizer)
    return LossOutput(loss, {"n_tokens": loss_mask_B_T.bool().sum()})

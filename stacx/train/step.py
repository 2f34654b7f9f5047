"""One optimizer step over a batch of view rows: the model-side half of the trainer.

:func:`samples_for` turns a source view's Arrow rows into packing samples (which columns are
prompt, completion, per-token and per-row values depends on the algorithm); :func:`train_step`
splits the samples into micro-batches of at most ``max_tokens`` positions (at least
``grad_accumulation`` of them), accumulates gradients with the losses of
``stacx.train.losses`` normalized by the whole batch's loss tokens (so the result is the
batch's token mean whatever the split), clips, and steps the optimizer.

Guarantees: a sample longer than ``max_tokens`` is never truncated: it gets a micro-batch of its
own. Runs synchronously; the actor calls it in a worker thread. Limits: one device; no PPO
epochs (one optimizer step per batch, so the trainer's pre-update logprobs are the proximal
ones for truncated importance sampling).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

import pyarrow as pa
import torch
from torch import nn

from stacx.train.attention import VARLEN_ATTENTION
from stacx.train.batches import opd_advantage_lists, samples_from_table
from stacx.train.config import TrainerConfig
from stacx.train.forward import packed_token_logprobs
from stacx.train.losses import (
    LossOutput,
    advantage_weighted_loss,
    policy_gradient_loss,
    sft_loss,
)
from stacx.train.packing import PackedBatch, Sample, pack, pack_shared


@dataclass(frozen=True)
class StepResult:
    loss: float
    n_samples: int
    n_tokens: int  # real positions forwarded
    n_loss_tokens: int
    grad_norm: float
    duration_ms: float
    metrics: dict[str, float]


def samples_for(cfg: TrainerConfig, table: pa.Table) -> list[Sample]:
    """Training samples from the source view's rows, per the algorithm's column layout."""
    algo = cfg.algorithm
    if algo == "grpo":
        adv = "advantage_std" if cfg.normalize_std else "advantage"
        return samples_from_table(
            table,
            completion="output_ids",
            token_columns={"behavior_logprobs": "behavior_logprobs"},
            scalar_columns={"advantages": adv},
        )
    if algo == "opd":
        table = opd_advantage_lists(
            table,
            discount=cfg.opd_discount,
            grpo_weight=cfg.opd_grpo_weight,
            center=cfg.opd_center,
        )
        return samples_from_table(
            table,
            completion="output_ids",
            token_columns={"behavior_logprobs": "student_logprobs", "advantages": "advantages"},
        )
    if algo == "aggrevate":
        return samples_from_table(
            table, completion="action_ids", scalar_columns={"advantages": "advantage"}
        )
    return samples_from_table(table, completion="completion_ids", loss_mask="loss_mask")


def micro_batches(
    samples: list[Sample], max_tokens: int, at_least: int, *, share: bool = False
) -> list[list[Sample]]:
    """Consecutive runs of samples of at most ``max_tokens`` positions (an oversized sample
    alone), split further until there are ``at_least`` of them (or one per sample). With
    ``share`` a sample whose prompt is already in the run costs its completion only (see
    `pack_shared`)."""
    groups: list[list[Sample]] = []
    used = 0
    prompts: set[tuple[int, ...]] = set()
    for s in samples:
        key = tuple(s.prompt_ids) if share else ()
        cost = len(s.completion_ids) if share and key in prompts else s.n_positions
        if groups and used + cost <= max_tokens:
            groups[-1].append(s)
            used += cost
        else:
            groups.append([s])
            used = s.n_positions
            prompts = set()
        prompts.add(key)
    target = min(at_least, len(samples))
    while len(groups) < target:
        i = max(range(len(groups)), key=lambda j: len(groups[j]))
        half = len(groups[i]) // 2
        groups[i : i + 1] = [groups[i][:half], groups[i][half:]]
    return groups


def _loss(
    cfg: TrainerConfig, model: nn.Module, batch: PackedBatch, normalizer: float
) -> LossOutput:
    logprobs = packed_token_logprobs(model, batch)
    mask = batch.loss_mask_R_T
    if cfg.algorithm in ("grpo", "opd"):
        return policy_gradient_loss(
            logprobs,
            batch.values_R_T["behavior_logprobs"],
            batch.values_R_T["advantages"],
            mask,
            clip_eps_low=cfg.clip_eps,
            clip_eps_high=cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high,
            # one optimizer step per batch: the pre-update logprobs are these, detached
            old_logprobs_B_T=logprobs.detach() if cfg.tis_cap is not None else None,
            tis_cap=cfg.tis_cap,
            normalizer=normalizer,
        )
    if cfg.algorithm == "aggrevate":
        return advantage_weighted_loss(logprobs, batch.values_R_T["advantages"], mask, normalizer)
    return sft_loss(logprobs, mask, normalizer)


def trainable_parameters(model: nn.Module, pattern: str) -> list[nn.Parameter]:
    """Parameters whose name matches ``pattern`` (all when empty); the others are frozen."""
    chosen = []
    for name, p in model.named_parameters():
        keep = not pattern or re.search(pattern, name) is not None
        p.requires_grad_(keep)
        if keep:
            chosen.append(p)
    return chosen


def make_optimizer(cfg: TrainerConfig, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(
        params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay
    )


def train_step(
    cfg: TrainerConfig,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    samples: list[Sample],
    step: int,
) -> StepResult:
    """One optimizer step (number ``step``, from 1) on ``samples``."""
    start = time.perf_counter()
    device = next(model.parameters()).device
    model.train()
    lr = cfg.lr * min(1.0, step / cfg.warmup_steps) if cfg.warmup_steps else cfg.lr
    for group in optimizer.param_groups:
        group["lr"] = lr
    normalizer = float(
        sum(sum(s.loss_mask) if s.loss_mask is not None else len(s.completion_ids) for s in samples)
    )
    optimizer.zero_grad(set_to_none=True)
    total_loss = 0.0
    n_tokens = 0
    sums: dict[str, float] = {}
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    share = cfg.share_prompts and impl != VARLEN_ATTENTION  # varlen kernels take no mask
    for micro in micro_batches(samples, cfg.max_tokens, cfg.grad_accumulation, share=share):
        row = max(cfg.max_tokens, max(s.n_positions for s in micro))
        batch = (pack_shared(micro, row) if share else pack(micro, row)).to(device)
        out = _loss(cfg, model, batch, max(normalizer, 1.0))
        out.loss.backward()
        total_loss += float(out.loss.detach())
        n_tokens += batch.n_tokens
        weight = batch.n_loss_tokens
        for k, v in out.metrics.items():
            if k != "n_tokens":
                sums[k] = sums.get(k, 0.0) + float(v) * weight
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if cfg.max_grad_norm is not None:
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
    else:
        grads = [p.grad.detach().norm() for p in params if p.grad is not None]
        grad_norm = float(torch.stack(grads).norm()) if grads else 0.0
    if math.isfinite(grad_norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    metrics = {k: v / max(normalizer, 1.0) for k, v in sums.items()}
    metrics["lr"] = lr
    metrics["skipped_nonfinite"] = 0.0 if math.isfinite(grad_norm) else 1.0
    return StepResult(
        loss=total_loss,
        n_samples=len(samples),
        n_tokens=n_tokens,
        n_loss_tokens=int(normalizer),
        grad_norm=grad_norm,
        duration_ms=(time.perf_counter() - start) * 1e3,
        metrics=metrics,
    )

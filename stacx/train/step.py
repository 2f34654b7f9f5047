"""One optimizer step over a batch of samples, the model-side half of the trainer: micro-batches of
at most ``max_tokens`` positions, losses normalized by the whole batch's loss tokens, clipping, and
the step; with ``distributed=True`` one FSDP2 rank's part of it. Guarantees: the result is the
batch's token mean whatever the split, and across ranks equals the one-device step; a sample is
never truncated. Synchronous (the actor runs it in a worker thread).
Design: docs/training.md#the-model-and-the-step
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from stacx.train.algorithms import algorithm_for
from stacx.train.attention import VARLEN_ATTENTION
from stacx.train.config import TrainerConfig
from stacx.train.forward import language_model, token_logprobs_of
from stacx.train.packing import Sample, pack, pack_shared, prompt_key


@dataclass(frozen=True)
class StepResult:
    loss: float
    n_samples: int
    n_tokens: int  # real positions forwarded
    n_loss_tokens: int
    grad_norm: float
    duration_ms: float
    metrics: dict[str, float]


def micro_batches(
    samples: list[Sample], max_tokens: int, at_least: int, *, share: bool = False
) -> list[list[Sample]]:
    """Consecutive runs of samples of at most ``max_tokens`` positions (an oversized sample alone),
    split until there are ``at_least``; with ``share`` a repeated prompt costs nothing more."""
    groups: list[list[Sample]] = []
    used = 0
    prompts: set[bytes] = set()
    for s in samples:
        key = prompt_key(s.prompt_ids) if share else b""
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
    # one fused kernel on CUDA (plain tensors; FSDP's DTensor shards take the foreach path)
    fused = bool(params) and all(p.is_cuda and type(p.data) is torch.Tensor for p in params)
    return torch.optim.AdamW(
        params,
        lr=cfg.lr,
        betas=cfg.betas,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        fused=fused or None,
    )


def _all_reduce(values: list[float], op: str = "SUM") -> list[float]:
    """`values` reduced over the ranks (``op``: a ``dist.ReduceOp`` name), in float64."""
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
    return [float(v) for v in t.cpu()]


def _filler(cfg: TrainerConfig) -> Sample:
    """A one-token stand-in for a rank with no sample of its own (its loss is weighted 0)."""
    return Sample([0], [0], {k: [0.0] for k in algorithm_for(cfg).values}, [1])


def _total_norm(params: list[nn.Parameter]) -> torch.Tensor:
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    norm = torch.nn.utils.get_total_norm(grads, 2.0)
    full = getattr(norm, "full_tensor", None)  # FSDP: a DTensor of partial norms
    return full() if callable(full) else norm


def _loss_tokens(s: Sample) -> int:
    return int(np.count_nonzero(s.loss_mask)) if s.loss_mask is not None else len(s.completion_ids)


def _micro_plan(
    cfg: TrainerConfig, samples: list[Sample], share: bool, distributed: bool
) -> tuple[list[list[Sample]], list[float]]:
    """The step's micro-batches and each one's loss weight: distributed, every rank runs as many as
    the busiest one (the extras weighted 0)."""
    micros = micro_batches(samples, cfg.max_tokens, cfg.grad_accumulation, share=share)
    weights = [1.0] * len(micros)
    if distributed:
        pad = int(_all_reduce([len(micros)], "MAX")[0]) - len(micros)
        micros += [micros[-1] if micros else [_filler(cfg)]] * pad
        weights += [0.0] * pad
    return micros, weights


def _apply_gradients(
    cfg: TrainerConfig, optimizer: torch.optim.Optimizer, device: torch.device
) -> float:
    """Clip and step (skipped for a non-finite gradient norm); returns the norm before clipping."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    norm = _total_norm(params)
    grad_norm = float(norm)
    if cfg.max_grad_norm is not None and params:
        torch.nn.utils.clip_grads_with_norm_(params, cfg.max_grad_norm, norm.to(device))
    if math.isfinite(grad_norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def train_step(
    cfg: TrainerConfig,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    samples: list[Sample],
    step: int,
    *,
    distributed: bool = False,
) -> StepResult:
    """One optimizer step (``step`` from 1) on ``samples`` (this rank's shard if distributed)."""
    start = time.perf_counter()
    device = next(model.parameters()).device
    model.train()
    lr = cfg.lr * min(1.0, step / cfg.warmup_steps) if cfg.warmup_steps else cfg.lr
    for group in optimizer.param_groups:
        group["lr"] = lr
    normalizer = float(sum(map(_loss_tokens, samples)))
    n_samples = len(samples)
    if distributed:
        normalizer, n_all = _all_reduce([normalizer, float(n_samples)])
        n_samples = int(n_all)
    optimizer.zero_grad(set_to_none=True)
    total_loss = 0.0
    n_tokens = 0
    sums: dict[str, float] = {}
    impl = getattr(getattr(language_model(model), "config", None), "_attn_implementation", None)
    share = cfg.share_prompts and impl != VARLEN_ATTENTION  # varlen kernels take no mask
    micros, weights = _micro_plan(cfg, samples, share, distributed)
    for micro, weight in zip(micros, weights, strict=True):
        row = max(cfg.max_tokens, max(s.n_positions for s in micro))
        batch = (pack_shared(micro, row) if share else pack(micro, row)).to(device)
        logprobs_B_T = token_logprobs_of(model, batch)
        out = algorithm_for(cfg).loss(cfg, logprobs_B_T, batch, max(normalizer, 1.0))
        (out.loss * weight if weight != 1.0 else out.loss).backward()
        for k, v in out.metrics.items():  # a filler names the keys too (weight 0)
            if k != "n_tokens":
                sums[k] = sums.get(k, 0.0) + float(v) * batch.n_loss_tokens * weight
        if weight == 0.0:
            continue
        total_loss += float(out.loss.detach())
        n_tokens += batch.n_tokens
    if distributed:
        keys = sorted(sums)
        totals = _all_reduce([total_loss, float(n_tokens), *(sums.get(k, 0.0) for k in keys)])
        total_loss, n_tokens = totals[0], int(totals[1])
        sums = dict(zip(keys, totals[2:], strict=True))
    grad_norm = _apply_gradients(cfg, optimizer, device)
    metrics = {k: v / max(normalizer, 1.0) for k, v in sums.items()}
    metrics["lr"] = lr
    metrics["skipped_nonfinite"] = 0.0 if math.isfinite(grad_norm) else 1.0
    return StepResult(
        loss=total_loss,
        n_samples=n_samples,
        n_tokens=n_tokens,
        n_loss_tokens=int(normalizer),
        grad_norm=grad_norm,
        duration_ms=(time.perf_counter() - start) * 1e3,
        metrics=metrics,
    )

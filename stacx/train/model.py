"""The model the trainer steps: :func:`build` is the one way a trainer rank gets its model and
optimizer from ``[trainer]`` (device and dtype, the CUDA fast path, activation checkpointing, FSDP2,
LoRA). Limits: every rank first loads the full model, then shards it; sharding is per decoder layer
of a transformers LM with ``model.layers``.
Design: docs/training.md#the-model-and-the-step
"""

from __future__ import annotations

import random

import torch
from torch import nn

from stacx.train import checkpoint, lora
from stacx.train.attention import use_varlen_attention
from stacx.train.config import TrainerConfig
from stacx.train.forward import ModelShapeError, PackedLM
from stacx.train.step import make_optimizer, trainable_parameters


def pick_device(cfg: TrainerConfig, rank: int = 0) -> tuple[torch.device, torch.dtype]:
    """Rank ``rank``'s device (CUDA: the configured index + rank) and the weights' dtype."""
    if cfg.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(cfg.device)
    if device.type == "cuda":
        device = torch.device("cuda", (device.index or 0) + rank)
    if cfg.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = getattr(torch, cfg.dtype)
    return device, dtype


def load_model(spec: str, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """The HF causal LM the engine serves (``resolve_model`` semantics), for training."""
    from transformers import AutoModelForCausalLM

    from stacx.hf import LOAD_LOCK, dtype_kwarg, resolve_model

    with LOAD_LOCK:  # from_pretrained is not thread-safe (see stacx.hf)
        model: nn.Module = AutoModelForCausalLM.from_pretrained(
            resolve_model(spec), **dtype_kwarg(dtype)
        )
        return model.to(device)


def decoder_layers(lm: nn.Module) -> list[nn.Module]:
    decoder = lm.get_decoder()  # type: ignore[operator]
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ModelShapeError(f"{type(lm).__name__}: no decoder.layers to shard or compile")
    return list(layers)


def _shard(
    lm: nn.Module, cfg: TrainerConfig, device: torch.device, dtype: torch.dtype
) -> nn.Module:
    """`lm` as FSDP2 units (each decoder layer, then a :class:`PackedLM` root), computing in `dtype`
    under ``mixed_precision``, reducing gradients in fp32 as sums."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(
        param_dtype=dtype if cfg.mixed_precision else None, reduce_dtype=torch.float32
    )
    for layer in decoder_layers(lm):
        fully_shard(layer, mp_policy=policy)
    model = PackedLM(lm)
    fully_shard(model, mp_policy=policy)
    for unit in model.modules():  # each FSDP unit reduces its own gradients
        if isinstance(unit, FSDPModule):
            unit.set_gradient_divide_factor(1.0)
            if device.type != "cuda":  # gloo has no PREMUL_SUM: a plain sum (then / 1)
                unit.set_force_sum_reduction_for_comms(True)
    return model


def build(
    cfg: TrainerConfig,
    weights: str | None,
    *,
    rank: int = 0,
    base: nn.Module | None = None,
    version: int = 0,
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """(model, optimizer) of rank ``rank`` from ``base`` or ``cfg.model``, resumed from ``weights``
    when given; sharded: a :class:`PackedLM` (the default process group must exist)."""
    torch.manual_seed(cfg.seed + version)
    random.seed(cfg.seed + version)
    device, dtype = pick_device(cfg, rank)
    store = torch.float32 if cfg.mixed_precision else dtype
    if base is not None:
        lm = base.to(device=device, dtype=store)
    else:
        lm = load_model(cfg.model, device, store)
    if cfg.lora is not None:
        lora.wrap(lm, cfg)  # the base frozen, the adapters trainable
    if weights is not None and cfg.lora is not None:
        lora.load(weights, lm)
    elif weights is not None:
        checkpoint.load(weights, lm)
    if cfg.fast and device.type == "cuda":
        use_varlen_attention(lm)
        # the chunked lm_head accumulates its weight gradient in fp32 (stacx.train.losses):
        # without TF32 that GEMM runs on SIMT cores, 28% of a 0.6B step on the H200 (profile,
        # tools/bench/train.py --profile); TF32 tensor cores keep fp32 range, 10-bit mantissa
        torch.backends.cuda.matmul.allow_tf32 = True
        if cfg.compile:
            for layer in decoder_layers(lm):
                layer.compile(dynamic=True)
    if cfg.activation_checkpointing:
        enable = getattr(lm, "gradient_checkpointing_enable", None)
        if not callable(enable):
            raise ModelShapeError(f"{type(lm).__name__} has no gradient checkpointing")
        enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.lora is None:  # with LoRA, trainer.trainable chose the adapted modules
        trainable_parameters(lm, cfg.trainable)
    model: nn.Module = _shard(lm, cfg, device, dtype) if cfg.sharded else lm
    # fully_shard keeps requires_grad: the sharded parameters are the trainable ones
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(cfg, params)
    if weights is not None:
        if cfg.sharded:
            checkpoint.load_sharded_optimizer(weights, model, optimizer)
        else:
            checkpoint.load_optimizer(weights, lm, optimizer)
    return model, optimizer

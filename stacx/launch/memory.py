"""The memory split of one GPU shared by the torch engine and the trainer.

A recipe declares it in ``[placement]``: ``engine_cache_gib`` (the engine's KV cache: the torch
engine sizes its cache to it, lowering ``engine.max_batch`` to the full-length sequences that fit)
and ``trainer_gib`` (the trainer's share: weights, gradients, optimizer state, activations).
:func:`check_split` runs when the rollout role has built its engine, before any episode or step:
it refuses, naming the keys and the figures, a split that does not fit the device (engine weights
+ cache + trainer share above the device's memory, less a reserve for the CUDA context and the
allocator's slack) and a trainer share below what the trainer's weights, gradients and AdamW
state alone take.

Enforcement: with ``placement.mode = "processes"`` (the GPU default) the trainer is a process of
its own, and :func:`enforce_trainer_share` caps its caching allocator at ``trainer_gib``
(``torch.cuda.set_per_process_memory_fraction``): a step that needs more fails with CUDA's
out-of-memory error in the trainer instead of taking the engine's cache. With ``local`` the
share is checked, not enforced (engine and trainer are threads of one process with one caching
allocator). Activations are not estimated (declare room for them). Ray placement may put the
trainer on another GPU: there the engine's part is checked alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from stacx.errors import ConfigError

if TYPE_CHECKING:
    from stacx.launch.recipe import Recipe

GIB = 2**30
RESERVE_GIB = 2.0  # CUDA context, cuBLAS workspaces, the allocator's fragmentation


def trainer_static_bytes(n_params: int, dtype_bytes: int, *, fp32_master: bool = False) -> int:
    """Weights + gradients + AdamW's two moments, per parameter (fp32 master weights and state
    with ``trainer.mixed_precision``)."""
    if fp32_master:
        return n_params * (dtype_bytes + 4 + 4 + 8)
    return n_params * dtype_bytes * 4


def check_split(
    *,
    device_bytes: int,
    engine_weights_bytes: int,
    cache_gib: float,
    trainer_gib: float,
    trainer_static: int,
) -> None:
    """Raise ConfigError when the declared split does not fit (see the module docstring);
    ``trainer_gib`` 0: the trainer is elsewhere or undeclared."""
    total = device_bytes / GIB
    parts = {
        "engine weights": engine_weights_bytes / GIB,
        "placement.engine_cache_gib": cache_gib,
        "placement.trainer_gib": trainer_gib,
        "reserve": RESERVE_GIB,
    }
    need = sum(parts.values())
    if need > total:
        said = " + ".join(f"{k} {v:.1f}" for k, v in parts.items())
        raise ConfigError(
            f"the GPU memory split does not fit: {said} = {need:.1f} GiB, the device has "
            f"{total:.1f} GiB; lower placement.engine_cache_gib or placement.trainer_gib"
        )
    if trainer_gib and trainer_static / GIB > trainer_gib:
        raise ConfigError(
            f"placement.trainer_gib = {trainer_gib:g}: the trainer's weights, gradients and "
            f"AdamW state alone take {trainer_static / GIB:.1f} GiB (before activations)"
        )


def cache_bytes(recipe: Recipe) -> int | None:
    """The torch engine's KV-cache budget (``placement.engine_cache_gib``; None: undeclared)."""
    gib = recipe.placement.engine_cache_gib
    return int(gib * GIB) if gib > 0 else None


def check_recipe_split(recipe: Recipe, engine: object) -> None:
    """:func:`check_split` for a started engine (a torch engine on CUDA; others pass)."""
    p = recipe.placement
    device = getattr(engine, "device", None)
    model = getattr(engine, "model", None)
    if not (p.engine_cache_gib or p.trainer_gib) or model is None:
        return
    if not isinstance(device, torch.device) or device.type != "cuda":
        return
    params = list(model.parameters())
    t = recipe.trainer
    colocated = (
        recipe.placement_mode != "ray"
        and not recipe.is_eval
        and t.device in ("auto", "cuda", str(device))
    )
    dtype_bytes = {"float32": 4}.get(t.dtype, 2)  # auto: bfloat16 on CUDA
    check_split(
        device_bytes=torch.cuda.get_device_properties(device).total_memory,
        engine_weights_bytes=sum(x.numel() * x.element_size() for x in params),
        cache_gib=p.engine_cache_gib,
        trainer_gib=p.trainer_gib if colocated else 0.0,
        trainer_static=trainer_static_bytes(
            sum(x.numel() for x in params), dtype_bytes, fp32_master=t.mixed_precision
        ),
    )


def enforce_trainer_share(recipe: Recipe) -> None:
    """Cap this process's CUDA allocations at ``placement.trainer_gib`` (the trainer's process
    under ``placement.mode = "processes"``); nothing without a declared share or a GPU."""
    gib = recipe.placement.trainer_gib
    if not gib or recipe.placement_mode != "processes" or not torch.cuda.is_available():
        return
    if recipe.trainer.device == "cpu":
        return
    device = torch.device(recipe.trainer.device if recipe.trainer.device != "auto" else "cuda")
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, gib * GIB / total), device)

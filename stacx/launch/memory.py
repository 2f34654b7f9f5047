"""The memory split of one GPU shared by the torch engine and the trainer (``[placement]``
``engine_cache_gib``, ``trainer_gib``): :func:`check_split` refuses, before any episode or step, a
split that does not fit the device or a trainer share below its static needs;
:func:`enforce_trainer_share` caps the trainer's allocator when it is a process of its own. Limits:
activations are not estimated; with ``local`` placement the share is checked only.
Design: docs/concepts/placement.md#engine-and-trainer-on-one-gpu
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
    """Weights + gradients + AdamW's two moments per parameter (fp32 master weights and state with
    ``trainer.mixed_precision``)."""
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
    """Raise ConfigError, naming the keys and figures, when the declared split does not fit;
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
    """Cap this process's CUDA allocations at ``placement.trainer_gib``, when declared."""
    gib = recipe.placement.trainer_gib
    if not gib or recipe.placement_mode != "processes" or not torch.cuda.is_available():
        return
    if recipe.trainer.device == "cpu":
        return
    device = torch.device(recipe.trainer.device if recipe.trainer.device != "auto" else "cuda")
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, gib * GIB / total), device)

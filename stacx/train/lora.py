"""LoRA adapters for the one trainer (``[trainer.lora]``), through ``peft``: :func:`wrap` injects
them into the HF model in place and freezes the base; a weight version is the adapter, written as a
PEFT adapter directory and loaded back bit for bit. Limits: plain LoRA only (no DoRA or rsLoRA; one
rank and alpha for every module); biases and non-adapted weights stay the base's.
Design: docs/training.md#lora-trainerlora
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from stacx.errors import ConfigError
from stacx.train import checkpoint
from stacx.train.config import LoraConfig, TrainerConfig

if TYPE_CHECKING:
    from peft import LoraConfig as PeftLoraConfig

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
_ADAPTER_NAME = "default"  # peft's name for the one adapter; PEFT files leave it out
_LORA_PARAM = re.compile(r"\.(lora_[AB])\.default\.weight$")


def target_modules(lm: nn.Module, cfg: TrainerConfig) -> list[str]:
    """The module names to adapt: short names (``q_proj``, ...) when every layer is adapted (what
    SGLang matches), else the full names of the modules ``trainer.trainable`` selects."""
    assert cfg.lora is not None
    wanted = set(cfg.lora.target_modules)
    found = [
        n
        for n, m in lm.named_modules()
        if isinstance(m, nn.Linear)
        and n.rsplit(".", 1)[-1] in wanted
        and (not cfg.trainable or re.search(cfg.trainable, f"{n}.weight"))
    ]
    if not found:
        raise ConfigError(
            f"trainer.lora.target_modules = {cfg.lora.target_modules}: no linear module of "
            f"{type(lm).__name__} matches"
            + (f" with trainer.trainable = {cfg.trainable!r}" if cfg.trainable else "")
        )
    return found if cfg.trainable else sorted({n.rsplit(".", 1)[-1] for n in found})


def peft_config(lm: nn.Module, cfg: TrainerConfig) -> PeftLoraConfig:
    """peft's ``LoraConfig`` for ``cfg.lora`` on ``lm`` (also what adapter_config.json says)."""
    from peft import LoraConfig as PeftLoraConfig

    lora: LoraConfig | None = cfg.lora
    assert lora is not None
    base = getattr(getattr(lm, "config", None), "_name_or_path", None) or cfg.model
    return PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,  # type: ignore[arg-type]  # typed int; peft scales by alpha / r
        lora_dropout=lora.dropout,
        target_modules=target_modules(lm, cfg),
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=str(base),
    )


def wrap(lm: nn.Module, cfg: TrainerConfig) -> nn.Module:
    """Inject LoRA layers into ``lm`` in place and return it; A is random (the caller's seed), B
    zero, so version 0 is the base model."""
    from peft import get_peft_model

    if any(_LORA_PARAM.search(n) for n, _ in lm.named_parameters()):
        raise ConfigError(
            f"{type(lm).__name__} already holds LoRA layers: hand the trainer an unadapted base"
        )
    get_peft_model(lm, peft_config(lm, cfg))
    return lm


def peft_name(param: str) -> str | None:
    """PEFT's file name of an adapter parameter of the wrapped model (None: not an adapter)."""
    param = param.removeprefix("lm.")  # FSDP's PackedLM root
    if not _LORA_PARAM.search(param):
        return None
    return PEFT_PREFIX + param.replace(f".{_ADAPTER_NAME}.weight", ".weight")


def adapter_state(named: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter tensors of ``named`` by PEFT name, detached views (snapshot before a step)."""
    out = {}
    for name, t in named.items():
        key = peft_name(name)
        if key is not None:
            out[key] = t.detach()
    return out


def adapter_bytes(state: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def write(tmp: Path, state: Mapping[str, torch.Tensor], config: PeftLoraConfig) -> None:
    """The adapter files of a staged checkpoint: ``model.safetensors`` under PEFT's names, with
    ``adapter_model.safetensors`` a hard link to it, and ``adapter_config.json``."""
    checkpoint.write_weights(tmp, state, partial=True)
    os.link(tmp / checkpoint.WEIGHTS_FILE, tmp / ADAPTER_FILE)
    config.save_pretrained(str(tmp))


def snapshot(
    version: int,
    lm: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    meta: dict[str, object],
) -> checkpoint.Snapshot:
    """A one-device LoRA trainer's version held still: ``weights`` are the adapter (owned copies);
    with ``optimizer`` the parts write the adapter directory and the optimizer state."""
    state = {k: t.clone() for k, t in adapter_state(dict(lm.named_parameters())).items()}
    parts: list[checkpoint.Part] = []
    if optimizer is not None:
        opt_state = checkpoint.owned(optimizer.state_dict())
        config = peft_config_of(lm)
        parts.append(lambda tmp: write(tmp, state, config))
        parts.append(lambda tmp: torch.save(opt_state, tmp / checkpoint.OPTIMIZER_FILE))
    first = next(iter(state.values()), None)
    if first is not None and first.is_cuda:
        torch.cuda.current_stream(first.device).synchronize()  # the clones are complete
    return checkpoint.Snapshot(
        version=version, weights=state, parts=tuple(parts), meta={**meta, "lora": True}
    )


def peft_config_of(lm: nn.Module) -> PeftLoraConfig:
    """The LoraConfig :func:`wrap` injected (peft keeps it on the model)."""
    configs = getattr(lm, "peft_config", None)
    if not isinstance(configs, dict) or _ADAPTER_NAME not in configs:
        raise ConfigError(f"{type(lm).__name__} was not wrapped by stacx.train.lora.wrap")
    config: PeftLoraConfig = configs[_ADAPTER_NAME]
    return config


def load(weights: Path | str, lm: nn.Module) -> None:
    """Copy an adapter checkpoint into ``lm``; CheckpointError unless every adapter tensor fits."""
    from safetensors.torch import load_file

    weights = Path(weights)
    if not (weights.parent / ADAPTER_CONFIG).is_file():
        raise checkpoint.CheckpointError(
            f"{weights}: no {ADAPTER_CONFIG} beside it (a full-weights checkpoint; resume it "
            "without [trainer.lora])"
        )
    state = load_file(str(weights))
    params = {k: p for n, p in lm.named_parameters() if (k := peft_name(n)) is not None}
    missing = sorted(set(params) - set(state))
    unknown = sorted(set(state) - set(params))
    wrong = [k for k in state if k in params and params[k].shape != state[k].shape]
    if missing or unknown or wrong:
        raise checkpoint.CheckpointError(
            f"{weights} does not fit the adapter: missing {missing[:3]}, unknown {unknown[:3]}, "
            f"shape mismatch {wrong[:3]} (another trainer.lora or trainer.trainable?)"
        )
    with torch.no_grad():
        for k, p in params.items():
            p.copy_(state[k].to(device=p.device, dtype=p.dtype))

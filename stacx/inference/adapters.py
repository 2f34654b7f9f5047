"""LoRA adapters served by the torch engine: each adapted weight becomes ``W_base + scaling * B @
A`` in place (fp32 product, rounded once), always against a kept base, so versions never stack.
A bad adapter is an :class:`EngineError` before any weight changes; plain LoRA only.
Design: docs/training.md#lora-trainerlora
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from stacx.errors import EngineError

ADAPTER_CONFIG = "adapter_config.json"
_PEFT_KEY = re.compile(r"^base_model\.model\.(.+)\.lora_([AB])\.weight$")


def adapter_dir(weights: str | Path) -> Path | None:
    """The adapter directory a published weights file belongs to (None: full weights)."""
    p = Path(weights)
    d = p if p.is_dir() else p.parent
    return d if (d / ADAPTER_CONFIG).is_file() else None


def scaling(directory: str | Path) -> float:
    """``lora_alpha / r`` from the directory's adapter_config.json (``/ sqrt(r)`` with
    rsLoRA); an :class:`EngineError` for what a plain merge cannot serve."""
    path = Path(directory) / ADAPTER_CONFIG
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise EngineError(f"adapter: cannot read {path}: {e}") from e
    if cfg.get("peft_type", "LORA") != "LORA" or cfg.get("use_dora"):
        raise EngineError(f"adapter {path}: only plain LoRA merges (peft_type LORA, no DoRA)")
    if cfg.get("rank_pattern") or cfg.get("alpha_pattern"):
        raise EngineError(f"adapter {path}: per-module rank_pattern/alpha_pattern not supported")
    if cfg.get("bias", "none") != "none":
        raise EngineError(f"adapter {path}: bias = {cfg['bias']!r}; only 'none' merges here")
    r, alpha = int(cfg["r"]), float(cfg["lora_alpha"])
    return alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r


def pairs(state: Mapping[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(A, B) per adapted weight name (``<module>.weight``) of a PEFT adapter state dict."""
    found: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in state.items():
        m = _PEFT_KEY.match(key)
        if m is None:
            raise EngineError(f"adapter: {key!r} is not a LoRA A/B tensor under PEFT's names")
        found.setdefault(f"{m.group(1)}.weight", {})[m.group(2)] = t
    half = [n for n, ab in found.items() if len(ab) != 2]
    if half:
        raise EngineError(f"adapter: A without B (or B without A) for {half[:3]}")
    return {n: (ab["A"], ab["B"]) for n, ab in found.items()}


class LoraMerge:
    """One engine model's merged adapter and the base of every weight it has adapted.
    Call from the thread that owns the model (the engine's worker)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.base: dict[str, torch.Tensor] = {}  # unmerged weights, by parameter name

    @torch.no_grad()
    def merge(self, state: Mapping[str, torch.Tensor], scale: float) -> None:
        """Serve base + ``state`` (a PEFT adapter state dict) with ``scale`` (alpha / r)."""
        params = dict(self.model.named_parameters())
        adapted = pairs(state)
        for name, (a, b) in adapted.items():
            w = params.get(name)
            if w is None:
                raise EngineError(f"adapter: {name} is not a parameter of this model")
            if (
                a.ndim != 2
                or b.ndim != 2
                or (b.shape[0], a.shape[1]) != tuple(w.shape)
                or (a.shape[0] != b.shape[1])
            ):
                raise EngineError(
                    f"adapter: {name} is {tuple(w.shape)}; A {tuple(a.shape)} and B "
                    f"{tuple(b.shape)} do not make that shape"
                )
        for name in [n for n in self.base if n not in adapted]:  # no longer adapted
            params[name].copy_(self.base.pop(name))
        for name, (a, b) in adapted.items():
            w = params[name]
            base = self.base.setdefault(name, w.detach().clone())
            delta = b.to(w.device, torch.float32) @ a.to(w.device, torch.float32)
            # out of place: base.float() IS the kept base when the weights are fp32
            w.copy_(torch.add(base.float(), delta, alpha=scale))

    def forget(self) -> None:
        """Full weights were loaded: the kept bases are stale."""
        self.base.clear()


def read_adapter(directory: str | Path) -> dict[str, torch.Tensor]:
    """The A/B tensors of an adapter directory (adapter_model.safetensors)."""
    from safetensors.torch import load_file

    path = Path(directory) / "adapter_model.safetensors"
    if not path.is_file():
        raise EngineError(f"adapter: {path} does not exist")
    return load_file(str(path))

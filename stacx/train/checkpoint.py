"""Checkpoints: one directory per weight version, ``<run_dir>/checkpoints/v<version>/``.

Each holds ``model.safetensors`` (the weights an engine loads; tied tensors stored once; when
only some parameters are trained, only those: the frozen rest is the base model's, which every
engine and a resuming trainer already hold),
``optimizer.pt`` (the optimizer's state dict, for an exact resume) and ``trainer.json`` (step,
version, algorithm). The sha256 published in ``WeightsPublished`` is the digest of
``model.safetensors``.

Guarantees: a checkpoint appears atomically (written to a temporary sibling directory, then
renamed), so a crash never leaves a half-written ``v<n>`` that a resume would trust; saving a
version that exists replaces it (a redo after a crash). Limits: one file per checkpoint (no
sharding); the optimizer state is a ``torch.save`` pickle, so load only checkpoints you wrote.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from stacx.errors import StacxError

WEIGHTS_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
META_FILE = "trainer.json"
_VERSION_DIR = re.compile(r"^v(\d+)$")


class CheckpointError(StacxError):
    """A checkpoint is missing, incomplete or does not match the model."""


def checkpoint_root(run_dir: Path | str) -> Path:
    return Path(run_dir) / "checkpoints"


def version_dir(run_dir: Path | str, version: int) -> Path:
    return checkpoint_root(run_dir) / f"v{version}"


def sha256_file(path: Path | str, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def save(
    run_dir: Path | str,
    version: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    meta: dict[str, object],
    *,
    only_trainable: bool = False,
) -> tuple[Path, str]:
    """Write version ``version``; returns (path of model.safetensors, its sha256).

    ``only_trainable`` writes the parameters with ``requires_grad`` only."""
    target = version_dir(run_dir, version)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".v{version}-", dir=target.parent))
    try:
        if only_trainable:
            # named_parameters() lists a tied tensor once, so there are no aliases to refuse
            state = {
                n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad
            }
            save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt", "partial": "1"})
        else:
            # save_model de-duplicates tied tensors (embedding = lm_head) that save_file refuses
            save_model(model, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        torch.save(optimizer.state_dict(), tmp / OPTIMIZER_FILE)
        (tmp / META_FILE).write_text(json.dumps({"version": version, **meta}, indent=2) + "\n")
        sha = sha256_file(tmp / WEIGHTS_FILE)
        tmp.chmod(0o755)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target / WEIGHTS_FILE, sha


def load(
    weights: Path | str, model: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, object]:
    """Load weights (and, when given, the optimizer state beside them) into ``model``.

    Returns the checkpoint's ``trainer.json``. Raises :class:`CheckpointError` naming the file
    when something is missing or does not fit the model."""
    weights = Path(weights)
    if not weights.is_file():
        raise CheckpointError(f"checkpoint weights {weights} do not exist")
    with safe_open(str(weights), framework="pt") as f:
        partial = (f.metadata() or {}).get("partial") == "1"
    try:
        if partial:
            own = model.state_dict()
            state = load_file(str(weights))
            unexpected = [k for k in state if k not in own]
            wrong = [k for k in state if k in own and own[k].shape != state[k].shape]
            if unexpected or wrong:
                raise CheckpointError(
                    f"{weights} does not fit the model: unknown {unexpected[:5]}, "
                    f"shape mismatch {wrong[:5]}"
                )
            model.load_state_dict(state, strict=False)
        else:
            missing, unexpected = load_model(model, str(weights), strict=False)
            if missing or unexpected:
                raise CheckpointError(
                    f"{weights} does not fit the model: missing {sorted(missing)[:5]}, "
                    f"unexpected {sorted(unexpected)[:5]}"
                )
    except CheckpointError:
        raise
    except Exception as e:  # safetensors raises RuntimeError on shape mismatches
        raise CheckpointError(f"{weights} does not fit the model: {e}") from e
    if optimizer is not None:
        opt_file = weights.parent / OPTIMIZER_FILE
        if not opt_file.is_file():
            raise CheckpointError(f"{opt_file} does not exist: cannot resume the optimizer")
        device = next(model.parameters()).device
        optimizer.load_state_dict(torch.load(opt_file, map_location=device, weights_only=True))
    meta_file = weights.parent / META_FILE
    meta: dict[str, object] = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
    return meta


def versions(run_dir: Path | str) -> list[int]:
    """Versions with a complete checkpoint directory, ascending."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        m = _VERSION_DIR.match(d.name)
        if m and (d / WEIGHTS_FILE).is_file():
            found.append(int(m.group(1)))
    return sorted(found)


def prune(run_dir: Path | str, latest: int, *, keep_last: int, save_every: int) -> list[int]:
    """Delete checkpoints older than the ``keep_last`` newest, except multiples of
    ``save_every`` (kept for good). The newest is never deleted; ``keep_last == 0`` keeps all.
    Returns the versions deleted."""
    if keep_last == 0:
        return []
    removed = []
    for v in versions(run_dir):
        if v > latest - max(keep_last, 1) or (save_every and v % save_every == 0):
            continue
        shutil.rmtree(version_dir(run_dir, v), ignore_errors=True)
        removed.append(v)
    return removed

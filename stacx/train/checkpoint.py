"""Checkpoints: one directory per weight version, ``<run_dir>/checkpoints/v<version>/``, made of
*parts* (weights, ``config.json``, optimizer state) that a ``Snapshot`` captures while the trainer
holds still and ``write`` writes later, possibly in another thread. Guarantees: a version appears
atomically (staged, fsync'ed, renamed), so a crash never leaves a half-written ``v<n>``; rewriting a
version replaces it. Limits: the optimizer state is a ``torch.save`` pickle (load only checkpoints
you wrote).
Design: docs/training.md#checkpoints-off-the-trainers-path
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, load_model, save_file
from torch import nn
from torch.utils._pytree import tree_map_only

from stacx.errors import StacxError

WEIGHTS_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
SHARDED_OPTIMIZER_DIR = "optimizer"  # a sharded trainer's (torch.distributed.checkpoint)
META_FILE = "trainer.json"
_VERSION_DIR = re.compile(r"^v(\d+)$")
_STAGING_DIR = re.compile(r"^\.v\d+-")

Part = Callable[[Path], None]
"""One piece of a checkpoint: writes its files into the staging directory it is given. Runs
in the writer (maybe another thread, after the next step began), so it may only read tensors
the snapshot owns."""


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


def staging(run_dir: Path | str, version: int) -> Path:
    """A fresh temporary sibling of version ``version``'s directory (see :func:`commit`)."""
    target = version_dir(run_dir, version)
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".v{version}-", dir=target.parent))


def write_weights(tmp: Path, state: Mapping[str, torch.Tensor], *, partial: bool) -> None:
    """``state`` as ``tmp/model.safetensors`` (``partial``: only the trained tensors)."""
    metadata = {"format": "pt", **({"partial": "1"} if partial else {})}
    tensors = {n: t.detach().contiguous() for n, t in state.items()}
    save_file(tensors, str(tmp / WEIGHTS_FILE), metadata=metadata)


def commit(
    tmp: Path, run_dir: Path | str, version: int, meta: dict[str, object]
) -> tuple[Path, str]:
    """Write ``trainer.json`` into the staged ``tmp``, fsync it all and rename it to ``v<version>``;
    returns (path of model.safetensors, sha256)."""
    target = version_dir(run_dir, version)
    (tmp / META_FILE).write_text(json.dumps({"version": version, **meta}, indent=2) + "\n")
    sha = sha256_file(tmp / WEIGHTS_FILE)
    _fsync_tree(tmp)
    tmp.chmod(0o755)
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    _fsync_dir(target.parent)
    return target / WEIGHTS_FILE, sha


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*"), key=lambda p: -len(p.parts)):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        else:
            _fsync_dir(path)
    _fsync_dir(root)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tied_aliases(lm: nn.Module) -> set[str]:
    """State-dict names that alias another parameter (a tied lm_head): stored once."""
    every = {n for n, _ in lm.named_parameters(remove_duplicate=False)}
    return every - {n for n, _ in lm.named_parameters()}


def owned(tree: object) -> object:
    """``tree`` (a nested state dict) with every tensor cloned (DTensors stay DTensors)."""
    return tree_map_only(torch.Tensor, lambda t: t.detach().clone(), tree)


@dataclass(frozen=True)
class Snapshot:
    """One version as the trainer held it: ``weights`` for engines, ``parts`` that write it,
    ``meta`` (``trainer.json``), and ``tmp``, a staging directory other ranks write into, or None.
    """

    version: int
    weights: Mapping[str, torch.Tensor]
    parts: tuple[Part, ...]
    meta: dict[str, object]
    tmp: Path | None = None


def weights_part(state: Mapping[str, torch.Tensor], *, partial: bool) -> Part:
    return lambda tmp: write_weights(tmp, state, partial=partial)


def config_part(model: nn.Module) -> Part:
    """The LM's ``config.json`` beside full weights, so ``v<n>/`` is a loadable HF directory."""
    to_json = getattr(getattr(model, "config", None), "to_json_file", None)
    return lambda tmp: to_json(str(tmp / "config.json")) if callable(to_json) else None


def snapshot(
    version: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    meta: dict[str, object],
    *,
    only_trainable: bool = False,
) -> Snapshot:
    """A one-device trainer's version (``optimizer`` None: weights only), owned on return."""
    params = {
        n: p.detach().clone()
        for n, p in model.named_parameters()
        if p.requires_grad or not only_trainable
    }
    parts: list[Part] = []
    if optimizer is not None:
        state = dict(params)
        if not only_trainable:  # persistent buffers too, as a full state dict holds them
            aliases = tied_aliases(model)
            for n, t in model.state_dict().items():
                if n not in state and n not in aliases:
                    state[n] = t.detach().clone()
        opt_state = owned(optimizer.state_dict())
        parts.append(weights_part(state, partial=only_trainable))
        if not only_trainable:
            parts.append(config_part(model))
        parts.append(lambda tmp: torch.save(opt_state, tmp / OPTIMIZER_FILE))
    device = next(model.parameters()).device
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
    return Snapshot(version=version, weights=params, parts=tuple(parts), meta=meta)


def write(run_dir: Path | str, snap: Snapshot) -> tuple[Path, str]:
    """Write ``snap`` as ``v<version>/`` atomically; returns (model.safetensors, its sha256)."""
    tmp = snap.tmp or staging(run_dir, snap.version)
    try:
        with _own_stream(snap.weights):
            for part in snap.parts:
                part(tmp)
        return commit(tmp, run_dir, snap.version, snap.meta)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def _own_stream(tensors: Mapping[str, torch.Tensor]) -> Iterator[None]:
    """On CUDA, the writer's host copies on a side stream: a copy on the default stream would wait
    for the engine's and trainer's work, and disturb an engine thread's CUDA graph capture."""
    first = next(iter(tensors.values()), None)
    if first is not None and first.device.type == "cuda":
        with torch.cuda.stream(torch.cuda.Stream(first.device)):
            yield
    else:
        yield


def clear_staging(run_dir: Path | str) -> list[str]:
    """Remove staging directories (``.v<n>-*``) a killed writer left; returns their names."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    gone = [d.name for d in root.iterdir() if d.is_dir() and _STAGING_DIR.match(d.name)]
    for name in gone:
        shutil.rmtree(root / name, ignore_errors=True)
    return gone


def save(
    run_dir: Path | str,
    version: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    meta: dict[str, object],
    *,
    only_trainable: bool = False,
) -> tuple[Path, str]:
    """Write version ``version`` now (``only_trainable``: the parameters with ``requires_grad``);
    returns (path of model.safetensors, its sha256)."""
    return write(run_dir, snapshot(version, model, optimizer, meta, only_trainable=only_trainable))


def load(
    weights: Path | str, model: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, object]:
    """Load weights (and, when given, the optimizer state) into ``model``; returns ``trainer.json``.
    Raises :class:`CheckpointError` naming the file when something is missing or does not fit."""
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
        load_optimizer(weights, model, optimizer)
    meta_file = weights.parent / META_FILE
    meta: dict[str, object] = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
    return meta


def load_optimizer(weights: Path | str, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """The one-device optimizer state (``optimizer.pt``) beside ``weights``."""
    opt_file = Path(weights).parent / OPTIMIZER_FILE
    if not opt_file.is_file():
        hint = " (a sharded checkpoint: resume with trainer.fsdp)" if _sharded(weights) else ""
        raise CheckpointError(f"{opt_file} does not exist: cannot resume the optimizer{hint}")
    device = next(model.parameters()).device
    optimizer.load_state_dict(torch.load(opt_file, map_location=device, weights_only=True))


def _sharded(weights: Path | str) -> bool:
    return (Path(weights).parent / SHARDED_OPTIMIZER_DIR).is_dir()


def sharded_optimizer_part(
    model: nn.Module, optimizer: torch.optim.Optimizer, group: object = None
) -> Part:
    """This rank's shard of the optimizer state (owned clones), written by
    torch.distributed.checkpoint into ``tmp/optimizer/``; collective over ``group`` (gloo, its own:
    a writer thread runs it)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = owned(get_optimizer_state_dict(model, optimizer))

    def part(tmp: Path) -> None:
        with _dcp_errors("writing", tmp / SHARDED_OPTIMIZER_DIR):
            dcp.save(
                {"optimizer": state},
                checkpoint_id=str(tmp / SHARDED_OPTIMIZER_DIR),
                process_group=group,  # type: ignore[arg-type]
            )

    return part


def load_sharded_optimizer(
    weights: Path | str, model: nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """Load the sharded optimizer state into every rank, resharded to its world size. Collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    if not _sharded(weights):
        raise CheckpointError(
            f"{Path(weights).parent / SHARDED_OPTIMIZER_DIR} does not exist: {weights} was "
            "written by a one-device trainer (resume it with world_size = 1 and fsdp = false)"
        )
    state = get_optimizer_state_dict(model, optimizer)  # allocates the state to load into
    where = Path(weights).parent / SHARDED_OPTIMIZER_DIR
    with _dcp_errors("reading", where):
        dcp.load({"optimizer": state}, checkpoint_id=str(where))
    set_optimizer_state_dict(model, optimizer, state)


@contextlib.contextmanager
def _dcp_errors(doing: str, where: Path) -> Iterator[None]:
    """DCP's failures as a `CheckpointError` naming the directory, each rank's error and the space
    left (DCP's ``CheckpointException`` is a ``BaseException``: it would pass ``except Exception``).
    """
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as exc:
        ranks = "; ".join(f"rank {r}: {error!r}" for r, (error, _) in exc.failures.items())
        probe = next((p for p in (where, *where.parents) if p.exists()), None)
        free = f", {shutil.disk_usage(probe).free / 2**30:.1f} GiB free there" if probe else ""
        raise CheckpointError(
            f"{doing} the sharded optimizer state at {where} failed ({ranks}{free})"
        ) from exc


def versions(run_dir: Path | str) -> list[int]:
    """Versions with a complete checkpoint directory, ascending."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    dirs = ((d, _VERSION_DIR.match(d.name)) for d in root.iterdir())
    return sorted(int(m.group(1)) for d, m in dirs if m and (d / WEIGHTS_FILE).is_file())


def prune(run_dir: Path | str, latest: int, *, keep_last: int, save_every: int) -> list[int]:
    """Delete checkpoints older than the ``keep_last`` newest, except multiples of ``save_every``;
    the newest is never deleted, ``keep_last == 0`` keeps all. Returns the versions deleted."""
    if keep_last == 0:
        return []
    removed = []
    for v in versions(run_dir):
        if v > latest - max(keep_last, 1) or (save_every and v % save_every == 0):
            continue
        shutil.rmtree(version_dir(run_dir, v), ignore_errors=True)
        removed.append(v)
    return removed

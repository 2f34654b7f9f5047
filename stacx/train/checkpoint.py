"""Checkpoints: one directory per weight version, ``<run_dir>/checkpoints/v<version>/``.

Each holds ``model.safetensors`` (the weights an engine loads; tied tensors stored once; when
only some parameters are trained, only those: the frozen rest is the base model's, which every
engine and a resuming trainer already hold),
``config.json`` (with full weights the directory is a loadable HF model), ``optimizer.pt`` (the
optimizer's state dict, for an exact resume; a sharded trainer writes ``optimizer/`` instead:
each rank's shard, torch.distributed.checkpoint, never gathered) and ``trainer.json`` (step,
version, algorithm). The sha256 published in ``WeightsPublished`` is the digest of
``model.safetensors``.

Guarantees: a checkpoint appears atomically (written to a temporary sibling directory, then
renamed), so a crash never leaves a half-written ``v<n>`` that a resume would trust; saving a
version that exists replaces it (a redo after a crash). Limits: the weights are one file (a
sharded trainer gathers them to rank 0's host memory to write it); the optimizer state is a ``torch.save`` pickle, so load only checkpoints you wrote.

What a checkpoint holds is a list of *parts* (:data:`Part`: a function that writes its files into
the staging directory): the weights, ``config.json``, the optimizer state; a new kind of state
(an adapter, a scheduler) is one more part. :func:`snapshot` copies what the parts write while the
trainer holds still (clones on the model's device: tens of ms even at 4B, where the write takes
tens of seconds), so :func:`write` can run later in another thread while the next step changes
the model (``trainer.background_checkpoint``). Files are fsync'ed before the rename: a version
directory, once there, survives a crash of the process or the machine.
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
    save_file(
        {n: t.detach().contiguous() for n, t in state.items()},
        str(tmp / WEIGHTS_FILE),
        metadata=metadata,
    )


def commit(
    tmp: Path, run_dir: Path | str, version: int, meta: dict[str, object]
) -> tuple[Path, str]:
    """Write ``trainer.json`` into the staged ``tmp``, fsync it all, then rename it to
    ``v<version>`` (replacing one that exists); returns (path of model.safetensors, sha256)."""
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
    """``tree`` (a state dict, nested) with every tensor cloned (DTensors stay DTensors): the
    snapshot owns them, the next optimizer step cannot change them."""
    return tree_map_only(torch.Tensor, lambda t: t.detach().clone(), tree)


@dataclass(frozen=True)
class Snapshot:
    """One version as the trainer held it after its step: ``weights`` are what engines load
    (by name, owned copies), ``parts`` write the checkpoint from owned copies, ``meta`` is
    ``trainer.json``. ``tmp``: a staging directory made at snapshot time, when other processes
    (trainer ranks) write into it too; otherwise :func:`write` makes one."""

    version: int
    weights: Mapping[str, torch.Tensor]
    parts: tuple[Part, ...]
    meta: dict[str, object]
    tmp: Path | None = None


def weights_part(state: Mapping[str, torch.Tensor], *, partial: bool) -> Part:
    return lambda tmp: write_weights(tmp, state, partial=partial)


def config_part(model: nn.Module) -> Part:
    return lambda tmp: write_config(tmp, model)


def snapshot(
    version: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    meta: dict[str, object],
    *,
    only_trainable: bool = False,
) -> Snapshot:
    """A one-device trainer's version ``version`` (see :class:`Snapshot`). ``optimizer`` None:
    the weights only, for engines (a version that will not be written). The clones are on the
    model's device and complete when this returns (the writer may use another CUDA stream)."""
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
    """Write ``snap`` as ``v<version>/`` atomically; returns (model.safetensors, its sha256). On CUDA its copies to host run on a stream of their own, so a CUDA graph
    capture of an engine thread of this process is not disturbed by them."""
    tmp = snap.tmp or staging(run_dir, snap.version)
    try:
        with _own_stream(snap.weights):
            for part in snap.parts:
                part(tmp)
        return commit(tmp, run_dir, snap.version, snap.meta)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class _own_stream:
    """On CUDA: the writer's copies go on a side stream (the default stream is shared with the
    engine and the trainer, and a copy on it would wait for their work)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        first = next(iter(tensors.values()), None)
        self.device = first.device if first is not None else torch.device("cpu")
        self.ctx: object = None

    def __enter__(self) -> None:
        if self.device.type == "cuda":
            self.ctx = torch.cuda.stream(torch.cuda.Stream(self.device))
            self.ctx.__enter__()  # type: ignore[attr-defined]

    def __exit__(self, *exc: object) -> None:
        if self.ctx is not None:
            self.ctx.__exit__(*exc)  # type: ignore[attr-defined]


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
    """Write version ``version`` now; returns (path of model.safetensors, its sha256).

    ``only_trainable`` writes the parameters with ``requires_grad`` only."""
    return write(run_dir, snapshot(version, model, optimizer, meta, only_trainable=only_trainable))


def write_config(tmp: Path, model: nn.Module) -> None:
    """The LM's ``config.json`` beside full weights, so ``v<n>/`` is a loadable HF directory
    (what SGLang's update_weights_from_disk and from_pretrained take)."""
    config = getattr(model, "config", None)
    to_json = getattr(config, "to_json_file", None)
    if callable(to_json):
        to_json(str(tmp / "config.json"))


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
    """This rank's shard of the optimizer state (owned clones, taken now), written into
    ``tmp/optimizer/`` by torch.distributed.checkpoint (one file per rank plus metadata;
    nothing is gathered). The write is collective over ``group`` (every rank runs its part, in
    the same order): a gloo group of its own, so that it can run in a writer thread beside the
    training step's NCCL collectives."""
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
    """The sharded optimizer state beside ``weights`` into every rank's ``optimizer``
    (resharded to the current world size by torch.distributed.checkpoint). Collective."""
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
    """torch.distributed.checkpoint's failures as a `CheckpointError` naming the directory, each
    rank's error and the space left there. DCP raises ``CheckpointException``, a
    ``BaseException``: left as it is, it passes every ``except Exception`` and ends the actor's
    task unseen (an 8B full fine-tune filling the disk showed it: the run hung)."""
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

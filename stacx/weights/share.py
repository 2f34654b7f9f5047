"""Weights across processes of one node, without a disk round trip: the trainer packs each version
into one CUDA IPC buffer (or /dev/shm segment on CPU) with a JSON manifest beside the checkpoint;
the engine maps it. A buffer is written once, never modified; off this node, ``take`` returns None
and the caller loads the file. Design: docs/engine.md#weight-sync
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import socket
import threading
import uuid
from collections import deque
from collections.abc import Mapping
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SHARE_DIR = "shared"  # <checkpoints>/shared/v<n>.json: the manifest of version v<n>


def manifest_path(path: str | Path) -> Path:
    """Where the manifest of the weights at ``path`` (``<checkpoints>/v<n>/<file>``) lives."""
    version_dir = Path(path).parent
    return version_dir.parent / SHARE_DIR / f"{version_dir.name}.json"


ALIGN = 256  # byte alignment of every tensor in the buffer (any dtype view is aligned)
SHM_DIR = Path("/dev/shm")


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _node() -> dict[str, str]:
    return {"host": socket.gethostname(), "boot_id": _boot_id()}


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dtype


def layout(state: Mapping[str, torch.Tensor]) -> tuple[list[dict[str, object]], int]:
    """(per tensor: name, dtype, shape, offset) and the buffer size for packing ``state``."""
    entries: list[dict[str, object]] = []
    offset = 0
    for name, t in state.items():
        entries.append(
            {"name": name, "dtype": str(t.dtype), "shape": list(t.shape), "offset": offset}
        )
        offset += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    return entries, max(offset, ALIGN)


def views(buffer: torch.Tensor, entries: list[dict[str, object]]) -> dict[str, torch.Tensor]:
    """The tensors of a packed uint8 ``buffer`` by name (views, no copy)."""
    out: dict[str, torch.Tensor] = {}
    for e in entries:
        dtype, shape, offset = _dtype(str(e["dtype"])), list(e["shape"]), int(e["offset"])  # type: ignore[call-overload]
        nbytes = math.prod(int(d) for d in shape) * torch.empty((), dtype=dtype).element_size()
        out[str(e["name"])] = buffer[offset : offset + nbytes].view(dtype).view(shape)
    return out


def _gpu_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


class _Shared:
    """One packed version: its buffer, the manifest's handle part, and its cleanup."""

    def __init__(self, state: Mapping[str, torch.Tensor], tag: str) -> None:
        entries, nbytes = layout(state)
        devices = {t.device for t in state.values()}
        if len(devices) > 1:
            raise ValueError(f"a weight snapshot on several devices: {sorted(map(str, devices))}")
        device = devices.pop() if devices else torch.device("cpu")
        self.path: Path | None = None
        if device.type == "cuda":
            self.buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
        else:
            self.path = SHM_DIR / f"stacx-weights-{tag}-{uuid.uuid4().hex[:12]}"
            with self.path.open("wb") as f:
                f.truncate(nbytes)
            self.buffer = torch.from_file(
                str(self.path), shared=True, size=nbytes, dtype=torch.uint8
            )
        handle = self._pack(state, entries)
        self.manifest: dict[str, object] = {**_node(), "tensors": entries, **handle}

    def _pack(
        self, state: Mapping[str, torch.Tensor], entries: list[dict[str, object]]
    ) -> dict[str, object]:
        with torch.no_grad():
            for view, t in zip(views(self.buffer, entries).values(), state.values(), strict=True):
                view.copy_(t)
        if self.buffer.device.type != "cuda":
            return {"kind": "shm", "file": str(self.path), "nbytes": self.buffer.numel()}
        torch.cuda.current_stream(self.buffer.device).synchronize()  # the bytes are written
        (dev, handle, size, offset, ref_handle, ref_offset, event, event_sync) = (
            self.buffer.untyped_storage()._share_cuda_()  # type: ignore[attr-defined]
        )
        b64 = lambda b: base64.b64encode(b).decode() if b else ""  # noqa: E731
        return {
            "kind": "cuda_ipc",
            "gpu_uuid": _gpu_uuid(int(dev)),
            "handle": b64(handle),
            "storage_bytes": int(size),
            "storage_offset": int(offset),
            "ref_counter_handle": b64(ref_handle),
            "ref_counter_offset": int(ref_offset),
            "event_handle": b64(event),
            "event_sync_required": bool(event_sync),
            "nbytes": self.buffer.numel(),
        }

    def drop(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)  # readers that mapped it keep their mapping
        cuda = self.buffer.is_cuda
        del self.buffer
        if cuda:  # free blocks whose readers have let go (torch keeps them until then)
            torch.cuda.ipc_collect()


def open_manifest(manifest: Mapping[str, object]) -> torch.Tensor | None:
    """Map the buffer a manifest names (None: not reachable from this process)."""
    if {k: manifest.get(k) for k in ("host", "boot_id")} != _node():
        return None
    nbytes = int(manifest["nbytes"])  # type: ignore[call-overload]
    if manifest.get("kind") == "shm":
        path = Path(str(manifest["file"]))
        if not path.is_file():
            return None  # dropped by the trainer (a newer version exists)
        return torch.from_file(str(path), shared=False, size=nbytes, dtype=torch.uint8)
    if manifest.get("kind") != "cuda_ipc" or not torch.cuda.is_available():
        return None
    gpus = range(torch.cuda.device_count())  # the GPU's index in this process, if visible here
    index = next((i for i in gpus if _gpu_uuid(i) == manifest["gpu_uuid"]), None)
    if index is None:
        return None
    unb64 = lambda s: base64.b64decode(str(s)) if s else b""  # noqa: E731
    storage = torch.UntypedStorage._new_shared_cuda(  # type: ignore[attr-defined]
        index,
        unb64(manifest["handle"]),
        int(manifest["storage_bytes"]),  # type: ignore[call-overload]
        int(manifest["storage_offset"]),  # type: ignore[call-overload]
        unb64(manifest["ref_counter_handle"]),
        int(manifest["ref_counter_offset"]),  # type: ignore[call-overload]
        unb64(manifest["event_handle"]),
        bool(manifest["event_sync_required"]),
    )
    return torch.empty(0, dtype=torch.uint8, device=f"cuda:{index}").set_(
        storage, 0, (nbytes,), (1,)
    )


class SharedWeights:
    """One process's side of the handoff: ``offer`` (trainer), ``take`` (engine; in the
    trainer's own process, the packed views directly)."""

    def __init__(self, *, keep: int = 2) -> None:
        self._lock = threading.Lock()
        self._kept: deque[tuple[str, str, _Shared]] = deque()
        self.keep = keep

    def offer(self, path: str, sha256: str, state: Mapping[str, torch.Tensor]) -> None:
        """Pack ``state`` (the weights at ``path``); write its manifest atomically."""
        try:
            shared = _Shared(state, tag=f"{os.getpid()}")
        except (RuntimeError, OSError) as e:  # e.g. no IPC from expandable segments, shm full
            log.warning(
                "weights %s: not shared across processes (%s); engines read the file", path, e
            )
            return
        manifest = {**shared.manifest, "path": path, "sha256": sha256}
        target = manifest_path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(manifest))
        tmp.replace(target)
        with self._lock:
            self._kept.append((path, sha256, shared))
            while len(self._kept) > self.keep:
                self._kept.popleft()[2].drop()

    def take(self, path: str, sha256: str) -> Mapping[str, torch.Tensor] | None:
        """The weights of ``path`` (digest ``sha256``) from the buffer, or None: load the file."""
        with self._lock:
            for p, s, shared in self._kept:
                if (p, s) == (path, sha256):
                    return views(shared.buffer, shared.manifest["tensors"])  # type: ignore[arg-type]
        try:
            manifest = json.loads(manifest_path(path).read_text())
        except (OSError, ValueError):
            return None
        if (manifest.get("path"), manifest.get("sha256")) != (path, sha256):
            return None  # the manifest of another write of this version directory
        try:
            buffer = open_manifest(manifest)
        except RuntimeError as e:  # CUDA refused the handle (no peer access, freed block)
            log.info("weights %s: shared buffer not mappable here (%s); using the file", path, e)
            return None
        return None if buffer is None else views(buffer, manifest["tensors"])

    def close(self) -> None:
        """Drop every kept buffer (the trainer's process is done)."""
        with self._lock:
            while self._kept:
                self._kept.popleft()[2].drop()

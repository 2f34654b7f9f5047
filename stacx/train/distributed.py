"""The one trainer as ``trainer.world_size`` ranks: FSDP2 over a torch.distributed group. Rank 0 is
the Trainer actor; :class:`RankGroup` starts ranks ``1..N-1`` on its node and broadcasts one command
at a time. Guarantees: every rank sees the same commands in the same order; a step equals the
one-device step up to fp32 reordering. Limits: one node; world sizes above 1 need a model path.
Design: docs/concepts/placement.md#the-ranks-commands
"""

from __future__ import annotations

import datetime
import logging
import socket
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from stacx.errors import StacxError
from stacx.train import checkpoint, lora
from stacx.train.checkpoint import tied_aliases
from stacx.train.config import TrainerConfig
from stacx.train.forward import language_model
from stacx.train.model import build, pick_device
from stacx.train.packing import Sample
from stacx.train.step import StepResult, train_step

log = logging.getLogger(__name__)


class RankError(StacxError):
    """A trainer rank could not start, or the group broke."""


def shard_by_tokens(samples: list[Sample], world_size: int) -> list[list[Sample]]:
    """``samples`` in ``world_size`` shards of about equal positions (longest first onto the least
    loaded); each shard keeps the batch's order."""
    load = [0] * world_size
    owner: dict[int, int] = {}
    for i in sorted(range(len(samples)), key=lambda j: -samples[j].n_positions):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        owner[i] = rank
        load[rank] += samples[i].n_positions
    return [[s for i, s in enumerate(samples) if owner[i] == r] for r in range(world_size)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _join(cfg: TrainerConfig, rank: int, port: int) -> object:
    """Join the default group; returns the gloo group that checkpoint writes use."""
    device, _ = pick_device(cfg, rank)
    timeout = datetime.timedelta(seconds=cfg.dist_timeout_s)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=cfg.world_size,
        timeout=timeout,
        device_id=device if device.type == "cuda" else None,
    )
    # checkpoint writes run in a writer thread while the trainer thread steps: their
    # collectives get a group of their own (gloo: host objects), never interleaved with the step's
    return dist.new_group(backend="gloo", timeout=timeout)


def _broadcast(command: dict[str, Any] | None) -> dict[str, Any]:
    box = [command]
    dist.broadcast_object_list(box, src=0)
    assert box[0] is not None
    return box[0]


def _scatter(shards: list[list[Sample]] | None) -> list[Sample]:
    box: list[Any] = [None]
    dist.scatter_object_list(box, shards, src=0)
    shard: list[Sample] = box[0]
    return shard


def full_weights(cfg: TrainerConfig, model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors by HF name on rank 0 (empty elsewhere; host memory with several ranks,
    the device at world size 1), tied aliases once, only the trained ones when partial. Collective.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    lm = language_model(model)
    offload = cfg.world_size > 1
    partial = bool(cfg.trainable or cfg.lora)
    # partial: gather the trained tensors only (a LoRA version never gathers the base)
    state = get_model_state_dict(
        model,
        options=StateDictOptions(
            full_state_dict=True, cpu_offload=offload, ignore_frozen_params=partial
        ),
    )
    drop = tied_aliases(lm)
    trained = {n for n, p in lm.named_parameters() if p.requires_grad}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        assert isinstance(tensor, torch.Tensor), name  # a model state dict holds tensors only
        name = name.removeprefix("lm.")
        if name in drop or (partial and name not in trained):
            continue
        # at world size 1 the gathered tensor can be the parameter itself: snapshot it, the
        # next step must not change what an engine is copying
        out[name] = tensor if offload else tensor.detach().clone()
    return out


class _Writer:
    """One thread running a rank's checkpoint writes in order (collectives pair across ranks)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="stacx-ckpt")
        self._last: Future[None] | None = None

    def submit(self, part: checkpoint.Part, tmp: Path) -> None:
        self._last = self._pool.submit(part, tmp)

    def drain(self) -> None:
        """Wait for every write submitted (a failed one raises here)."""
        if self._last is not None:
            last, self._last = self._last, None
            last.result()


def _serve(rank: int, cfg_json: bytes, port: int, weights: str | None, version: int) -> None:
    """Body of ranks 1..N-1: join, build, then run rank 0's commands until ``stop``."""
    cfg = msgspec.json.decode(cfg_json, type=TrainerConfig)
    group = _join(cfg, rank, port)
    writer = _Writer()
    try:
        model, optimizer = build(cfg, weights, rank=rank, version=version)
        dist.barrier()
        while True:
            command = _broadcast(None)
            op = command["op"]
            if op == "step":
                train_step(cfg, model, optimizer, _scatter(None), command["step"], distributed=True)
            elif op == "snapshot":
                full_weights(cfg, model)  # rank 0 gathers them: a collective
                if command["tmp"] is not None:
                    part = checkpoint.sharded_optimizer_part(model, optimizer, group)
                    writer.submit(part, Path(command["tmp"]))
            elif op == "load":
                writer.drain()
                model, optimizer = build(
                    cfg, command["weights"], rank=rank, version=command["version"]
                )
            elif op == "stop":
                writer.drain()
                return
    finally:
        dist.destroy_process_group()


class RankGroup:
    """Rank 0's side of the group. Synchronous: one call at a time, from one thread."""

    def __init__(self, cfg: TrainerConfig) -> None:
        self.cfg = cfg
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self._procs: list[Any] = []
        self._group: object = None  # the checkpoint writes' gloo group

    def start(
        self, weights: str | None, *, version: int = 0, base: nn.Module | None = None
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Spawn ranks 1..N-1, join the group and build every rank's model (from ``weights`` when
        given); returns rank 0's (sharded model, optimizer)."""
        cfg = self.cfg
        if dist.is_initialized():
            raise RankError("a torch.distributed group already exists in this process")
        last, _ = pick_device(cfg, cfg.world_size - 1)
        if last.type == "cuda" and (last.index or 0) >= torch.cuda.device_count():
            raise RankError(
                f"trainer.world_size = {cfg.world_size} needs {last} (one GPU per rank), this "
                f"process sees {torch.cuda.device_count()} GPU(s)"
            )
        port = _free_port()
        ctx = mp.get_context("spawn")
        blob = msgspec.json.encode(cfg)
        for rank in range(1, cfg.world_size):
            proc = ctx.Process(
                target=_serve, args=(rank, blob, port, weights, version), daemon=True
            )
            proc.start()
            self._procs.append(proc)
        try:
            self._group = _join(cfg, 0, port)
            self.model, self.optimizer = build(cfg, weights, rank=0, base=base, version=version)
            dist.barrier()
        except BaseException:
            self.close()
            raise
        log.info("trainer: %d ranks joined (%s)", cfg.world_size, dist.get_backend())
        return self.model, self.optimizer

    def load(self, weights: str | None, version: int) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Every rank rebuilds from ``weights`` (None: the base model)."""
        _broadcast({"op": "load", "weights": weights, "version": version})
        self.model, self.optimizer = build(self.cfg, weights, rank=0, version=version)
        return self.model, self.optimizer

    def step(self, samples: list[Sample], step: int) -> StepResult:
        assert self.model is not None and self.optimizer is not None
        _broadcast({"op": "step", "step": step})
        shard = _scatter(shard_by_tokens(samples, self.cfg.world_size))
        return train_step(self.cfg, self.model, self.optimizer, shard, step, distributed=True)

    def snapshot(
        self, run_dir: Path | str, version: int, meta: dict[str, object], *, write: bool
    ) -> checkpoint.Snapshot:
        """Version ``version`` held still; with ``write`` its directory is staged and the other
        ranks' writes under way: rank 0 then ``checkpoint.write``s it, the collective that ends
        them."""
        assert self.model is not None and self.optimizer is not None
        tmp = checkpoint.staging(run_dir, version) if write else None
        _broadcast({"op": "snapshot", "tmp": str(tmp) if tmp is not None else None})
        state = full_weights(self.cfg, self.model)
        parts: list[checkpoint.Part] = []
        if self.cfg.lora is not None:  # the version is the adapter (stacx.train.lora)
            state = lora.adapter_state(state)
            meta = {**meta, "lora": True}
        if write:
            parts = [checkpoint.sharded_optimizer_part(self.model, self.optimizer, self._group)]
            if self.cfg.lora is not None:
                config = lora.peft_config_of(language_model(self.model))
                parts.append(lambda staged: lora.write(staged, state, config))
            else:
                parts.append(checkpoint.weights_part(state, partial=bool(self.cfg.trainable)))
            if not (self.cfg.trainable or self.cfg.lora):
                parts.append(checkpoint.config_part(language_model(self.model)))
        if state and next(iter(state.values())).is_cuda:
            torch.cuda.current_stream().synchronize()  # the clones are complete for the writer
        return checkpoint.Snapshot(
            version=version, weights=state, parts=tuple(parts), meta=meta, tmp=tmp
        )

    def save(
        self, run_dir: Path | str, version: int, meta: dict[str, object]
    ) -> tuple[Path, str, dict[str, torch.Tensor]]:
        """Checkpoint ``v<version>`` now; returns (model.safetensors, sha256, the full weights)."""
        snap = self.snapshot(run_dir, version, meta, write=True)
        path, sha = checkpoint.write(run_dir, snap)
        return path, sha, dict(snap.weights)

    def close(self) -> None:
        """Stop the ranks and leave the group (idempotent)."""
        if dist.is_initialized():
            try:
                if self.model is not None:
                    _broadcast({"op": "stop"})
            finally:
                dist.destroy_process_group()
        for proc in self._procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
        self._procs = []
        self.model = self.optimizer = None

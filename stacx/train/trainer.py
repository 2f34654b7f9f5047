"""The Trainer actor: readiness from the log, a step, a new weight version, a checkpoint. Step n
produces version n; ``WeightsPublished`` is the commit point. Guarantees: checkpoints are atomic; on
resume it redoes every recorded step after its newest durable checkpoint on exactly its recorded
episode ids (bit for bit on CPU).
Design: docs/training.md#the-trainers-step
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from stacx.actors.base import Actor
from stacx.device_lock import exclusive
from stacx.events import (
    CheckpointSaved,
    Event,
    TrainerResumed,
    TrainStepFinished,
    WeightsPublished,
    derive_id,
)
from stacx.ports import WeightOffer
from stacx.train import checkpoint, lora, units
from stacx.train.algorithms import ALGORITHMS, algorithm_for, batch_units, ready_threshold
from stacx.train.batches import Query, StepBatch, scalar_rows, step_batch
from stacx.train.config import TrainerConfig
from stacx.train.distributed import RankGroup
from stacx.train.model import build, load_model, pick_device
from stacx.train.step import StepResult, train_step
from stacx.train.units import gate_sql, ready_units_sql, redo_steps_sql, trainer_state_sql

# load_model, pick_device: stacx.train.model; Query, StepBatch, step_batch: stacx.train.batches
__all__ = ["Query", "StepBatch", "Trainer", "load_model", "pick_device", "step_batch"]

log = logging.getLogger(__name__)


class Trainer(Actor):
    name: ClassVar[str] = "trainer"
    # every kind that wakes some algorithm; `handle` acks the others of its own at once
    kinds: ClassVar[tuple[type[Event], ...]] = tuple(
        dict.fromkeys(kind for a in ALGORITHMS.values() for kind in a.wakes)
    )
    max_inflight: ClassVar[int] = 1
    ack_wait: ClassVar[float] = 120.0

    def __init__(
        self,
        config: TrainerConfig,
        *,
        model: nn.Module | None = None,
        handoff: WeightOffer | None = None,
    ) -> None:
        """``model``: a base model to train in place instead of ``config.model``; ``handoff``:
        receives a snapshot of every version, for engines of this process."""
        self.config = config
        self.algorithm = algorithm_for(config)  # a key the algorithm rules out fails here
        self.handoff = handoff
        self._base = model
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.version = 0
        self._redo: dict[int, list[str]] = {}  # version -> episode ids of a recorded step to redo
        self._published = 0  # the newest version in the log (a redo up to it publishes nothing)
        self._writer: asyncio.Task[None] | None = None  # the background checkpoint write
        self._loaded = -1  # the version the model in memory holds
        self._dirty = False  # a step began and did not publish: the model in memory is suspect
        self._group: RankGroup | None = None  # the ranks, when sharded (stacx.train.distributed)
        # the stream sequence the last "nothing ready" answer saw the log up to: an event at or
        # below it is already counted, so a burst of rewards costs one readiness query, not one each
        self._checked = 0

    @property
    def finished(self) -> bool:
        return self.version >= self.config.steps

    # ---- recovery --------------------------------------------------------------------------

    async def on_start(self) -> None:
        await self._drain()
        rows = scalar_rows(await self.query(trainer_state_sql(), barrier=True))
        self._published = int(rows[0]["version"]) if rows else 0
        if self.model is not None and not self._dirty and self._loaded == self._published:
            self.version, self._redo = self._published, {}  # a restart: what we hold is current
            return
        gone = await asyncio.to_thread(checkpoint.clear_staging, self.ctx.run_dir)
        durable = _newest_durable(self.ctx.run_dir, self._published)
        bounds = {"durable": durable, "published": self._published}
        redo = scalar_rows(await self.query(redo_steps_sql(), bounds))
        self._redo = {int(r["version"]): [str(e) for e in r["episode_ids"]] for r in redo}
        expected = list(range(durable + 1, durable + 1 + len(self._redo)))
        if sorted(self._redo) != expected or len(self._redo) < self._published - durable:
            raise checkpoint.CheckpointError(
                f"cannot resume: newest durable checkpoint v{durable}, published "
                f"v{self._published}, recorded steps {sorted(self._redo)} (a gap)"
            )
        self.version = durable
        path = str(checkpoint.version_dir(self.ctx.run_dir, durable) / checkpoint.WEIGHTS_FILE)
        await asyncio.to_thread(exclusive, self._build, path if durable else None)
        if self._published or self._redo:  # a warning: a recovery is worth seeing by default
            log.warning(
                "trainer: at version %d; resuming from durable checkpoint v%d%s%s",
                self._published,
                durable,
                f", redoing steps {sorted(self._redo)} from their recorded episode ids"
                if self._redo
                else "",
                f" (removed half-written {', '.join(gone)})" if gone else "",
            )
            await self.publish(
                TrainerResumed(
                    run_id=self.run_id,
                    version=self._published,
                    durable_version=durable,
                    redo_steps=sorted(self._redo),
                )
            )

    def _build(self, weights: str | None) -> None:
        cfg = self.config
        if self.model is not None and not self._dirty and self._loaded == self.version:
            return  # what we hold is what the log says: nothing to recover
        base = self._base if not self._dirty else None
        if cfg.sharded:
            if self._group is None:
                self._group = RankGroup(cfg)
                self.model, self.optimizer = self._group.start(
                    weights, version=self.version, base=base
                )
            else:
                self.model, self.optimizer = self._group.load(weights, self.version)
        else:
            self.model, self.optimizer = build(cfg, weights, base=base, version=self.version)
        self._loaded, self._dirty = self.version, False

    def close(self) -> None:
        """Stop the ranks of a sharded trainer (the role builder calls it on exit)."""
        if self._group is not None:
            self._group.close()
            self._group = None

    # ---- the loop --------------------------------------------------------------------------

    async def handle(self, event: Event) -> None:
        # only the kinds that can complete one of the algorithm's units make the trainer ask
        # the log (RunStarted: a resumed run re-checks at once); the others are acked at once
        if not isinstance(event, self.algorithm.wakes) or self.ctx.watermark.seq <= self._checked:
            return
        while not self.finished:
            episode_ids = await self._next_batch()
            if episode_ids is None:
                return
            await self._step(episode_ids)

    async def _next_batch(self) -> list[str] | None:
        if self.version + 1 in self._redo:
            return self._redo[self.version + 1]
        cfg = self.config
        head = await self.ctx.head()  # a barrier: the answer below covers every event up to head
        self.ctx.watermark.advance(head)
        gate = gate_sql(cfg)
        if gate is not None:
            (row,) = scalar_rows(await self.query(gate, units.params(cfg, gate, self.version)))
            if not row["open"]:
                self._checked = head
                return None  # its iteration is still in flight: labels, scores or samples
        sql = ready_units_sql(cfg)
        ready = scalar_rows(await self.query(sql, units.params(cfg, sql, self.version)))
        if len(ready) < ready_threshold(cfg):
            self._checked = head
            return None
        chosen = ready[: batch_units(cfg)]
        return [str(e) for u in chosen for e in u["episode_ids"]]

    async def _step(self, episode_ids: list[str]) -> None:
        cfg = self.config
        read = time.perf_counter()
        batch = await step_batch(cfg, self.query, episode_ids, version=self.version)
        samples = batch.samples
        batch_ms = (time.perf_counter() - read) * 1e3
        step = self.version + 1
        assert self.model is not None and self.optimizer is not None
        model, optimizer = self.model, self.optimizer
        self._dirty = True
        if self._group is not None:
            result = await asyncio.to_thread(exclusive, self._group.step, samples, step)
        else:
            result = await asyncio.to_thread(
                exclusive, train_step, cfg, model, optimizer, samples, step
            )
        held = time.perf_counter()
        write = self._write_kind(step)
        snap, path, sha, save_ms = await self._hold(step, result, write)
        hold_ms = (time.perf_counter() - held) * 1e3
        log.info(
            "trainer: step %d on %d samples: loss %.4f, %.0f ms; then %.0f ms to publish "
            "(checkpoint %s)",
            step,
            result.n_samples,
            result.loss,
            result.duration_ms,
            hold_ms,
            _WRITES[write].format(save_ms),
        )
        if step not in self._redo:
            await self.publish(
                self._finished(step, batch, result, episode_ids, save_ms, batch_ms, hold_ms)
            )
        if step > self._published:
            await self.publish(
                WeightsPublished(
                    run_id=self.run_id,
                    event_id=derive_id(self.run_id, "weights", step),
                    version=step,
                    path=str(path),
                    sha256=sha,
                    step=step,
                    durable=write == "now",
                    bytes=path.stat().st_size if write == "now" else _tensor_bytes(snap),
                )
            )
            self._published = step
        if write == "now":
            await self._saved(step, path, sha, save_ms)
        elif write == "background":
            await self._drain()  # done already (see _write_kind): raises if it failed
            self._writer = asyncio.create_task(self._write_in_background(snap))
        self.version = self._loaded = step
        self._redo.pop(step, None)
        self._dirty = False

    async def _hold(
        self, step: int, result: StepResult, write: str | None
    ) -> tuple[checkpoint.Snapshot, Path, str, float]:
        """Snapshot version ``step``, write it if ``write == "now"``, hand its weights to this
        process's engines; returns (snapshot, weights path, sha256 or "", write ms)."""
        snap = await asyncio.to_thread(exclusive, self._snapshot, step, result, write is not None)
        path = checkpoint.version_dir(self.ctx.run_dir, step) / checkpoint.WEIGHTS_FILE
        sha, save_ms = "", 0.0
        if write == "now":
            await self._drain()
            saved = time.perf_counter()
            path, sha = await asyncio.to_thread(exclusive, checkpoint.write, self.ctx.run_dir, snap)
            save_ms = (time.perf_counter() - saved) * 1e3
        if self.config.inprocess_handoff and self.handoff is not None:
            self.handoff.offer(str(path), sha, snap.weights)
        return snap, path, sha, save_ms

    def _write_kind(self, step: int) -> str | None:
        """Whether version ``step`` is written "now", in the "background", or not at all (None)."""
        cfg = self.config
        if step in self._redo and step < self._published:
            return None  # on the way back to the published version: it is in the log already
        if step == cfg.steps or step == self._published:
            return "now"  # the run's result; or the version a restarted engine waits for
        if cfg.lora is not None:
            return "now"  # an adapter is merged from its dir: docs/training.md#the-trainers-step
        if step % cfg.checkpoint_every:
            return None
        if not cfg.background_checkpoint:
            return "now"
        if self._writer is not None and not self._writer.done():
            log.info("trainer: v%d not written: the write of an earlier version is under way", step)
            return None
        return "background"

    async def _write_in_background(self, snap: checkpoint.Snapshot) -> None:
        start = time.perf_counter()
        path, sha = await asyncio.to_thread(checkpoint.write, self.ctx.run_dir, snap)
        await self._saved(snap.version, path, sha, (time.perf_counter() - start) * 1e3)

    async def _saved(self, version: int, path: Path, sha: str, ms: float) -> None:
        """Version ``version`` is durable: say so, then prune older checkpoints."""
        await self.publish(
            CheckpointSaved(
                run_id=self.run_id,
                event_id=derive_id(self.run_id, "checkpoint", version, sha),
                version=version,
                path=str(path),
                sha256=sha,
                duration_ms=ms,
                nbytes=await asyncio.to_thread(_nbytes, path.parent),
            )
        )
        keep = {"keep_last": self.config.keep_last, "save_every": self.config.save_every}
        await asyncio.to_thread(checkpoint.prune, self.ctx.run_dir, version, **keep)

    async def _drain(self) -> None:
        """Wait for the background write; its failure raises here (restart from the log)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            await writer

    async def on_stop(self) -> None:
        await self._drain()

    def _finished(
        self,
        step: int,
        batch: StepBatch,
        result: StepResult,
        episode_ids: list[str],
        save_ms: float,
        batch_ms: float,
        hold_ms: float,
    ) -> TrainStepFinished:
        """The step's record: what it trained on (lineage), its loss, timings and staleness."""
        cfg = self.config
        # the columns the lineage needs, not the token lists (a whole prompt per row)
        meta = ("episode_id", "branch_episode_id", "reward", "weight_version")
        rows = scalar_rows(batch.table.select([c for c in meta if c in batch.table.column_names]))
        rewards = _episode_rewards(rows)
        return TrainStepFinished(
            run_id=self.run_id,
            event_id=derive_id(self.run_id, "step", step),
            step=step,
            algorithm=cfg.algorithm,
            loss=result.loss,
            weight_version=step,
            reward_mean=sum(rewards) / len(rewards) if rewards else None,
            n_samples=batch.n_rows,
            n_tokens=result.n_tokens,
            duration_ms=result.duration_ms,
            world_size=cfg.world_size,
            metrics_json=json.dumps(
                {
                    **result.metrics,
                    "grad_norm": result.grad_norm,
                    "n_loss_tokens": result.n_loss_tokens,
                    "n_sequences": result.n_samples,  # packed: one per episode segment
                    "checkpoint_ms": save_ms,  # a write before publishing (0: background, none)
                    "hold_ms": hold_ms,  # step end to publish: snapshot, handoff, that write
                    "batch_ms": batch_ms,  # the batch's queries and samples
                    "batch_prompt_ids": batch.prompt_ids_read,
                    "max_staleness": _max_staleness(rows, self.version),
                }
            ),
            episode_ids=sorted(set(episode_ids)),
        )

    def _snapshot(self, step: int, result: StepResult, write: bool) -> checkpoint.Snapshot:
        """Version ``step`` held still: weights for this process's engines; with ``write``, the
        rest."""
        assert self.model is not None and self.optimizer is not None
        cfg = self.config
        meta: dict[str, object] = {
            "step": step,
            "algorithm": cfg.algorithm,
            "loss": result.loss,
            "world_size": cfg.world_size,
        }
        if not write and not (cfg.inprocess_handoff and self.handoff is not None):
            return checkpoint.Snapshot(version=step, weights={}, parts=(), meta=meta)
        if self._group is not None:
            return self._group.snapshot(self.ctx.run_dir, step, meta, write=write)
        optimizer = self.optimizer if write else None
        if cfg.lora is not None:  # the version is the adapter (stacx.train.lora)
            return lora.snapshot(step, self.model, optimizer, meta)
        trainable = bool(cfg.trainable)
        return checkpoint.snapshot(step, self.model, optimizer, meta, only_trainable=trainable)


_WRITES = {
    "now": "written, {:.0f} ms",
    "background": "writing in the background",
    None: "not written",
}


def _tensor_bytes(snap: checkpoint.Snapshot) -> int:
    """A version not written yet: the bytes of the tensors held for it (0: none held)."""
    return sum(t.numel() * t.element_size() for t in snap.weights.values())


def _nbytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def _newest_durable(run_dir: Path | str, published: int) -> int:
    """The newest complete checkpoint at or below ``published`` (0: none, the base model)."""
    return max((v for v in checkpoint.versions(run_dir) if v <= published), default=0)


def _episode_rewards(rows: list[dict[str, object]]) -> list[float]:
    seen: dict[str, float] = {}
    for r in rows:
        ep, reward = r.get("episode_id") or r.get("branch_episode_id"), r.get("reward")
        if isinstance(ep, str) and isinstance(reward, int | float):
            seen[ep] = float(reward)
    return list(seen.values())


def _max_staleness(rows: list[dict[str, object]], version: int) -> int:
    versions = [r["weight_version"] for r in rows if isinstance(r.get("weight_version"), int)]
    return max((version - int(v) for v in versions), default=0)  # type: ignore[call-overload]

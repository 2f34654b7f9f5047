"""The Trainer actor: readiness from the log, a step, a checkpoint, a new weight version.

Driven by the signals that can complete a unit of its algorithm (``Trainer.wakes``: rewards,
labels, scores, costs-to-go, failures): each one makes it ask the log, in SQL, whether a step
is ready (:mod:`stacx.train.units`: in sync mode the step's iteration is settled, and enough
complete units exist, each with every label, score or branch it waits for), and while one is it

1. materializes the batch from the algorithm's view (Arrow -> samples -> packed tensors; with
   ``pack_episodes`` the turns of an episode that extend each other are one sequence, rebuilt
   from the stored deltas: `step_batch`),
2. computes the loss and steps the optimizer (:mod:`stacx.train.step`, in a worker thread),
3. writes ``checkpoints/v<version>/`` (weights, or with ``[trainer.lora]`` the adapter:
   stacx.train.lora; optimizer state) atomically,
4. publishes ``TrainStepFinished{step, episode_ids, ...}`` (the lineage: what this version was
   trained on) and then ``WeightsPublished{version, path, sha256}`` (the commit point).

Step n produces version n; after ``steps`` steps it publishes nothing more.

Resume (:meth:`Trainer.on_start`, also after a supervisor restart): everything comes from the
log. The newest ``WeightsPublished`` gives the version and the checkpoint to load (weights and
optimizer state); the episodes already trained on are those of the committed steps' episode
ids. A ``TrainStepFinished`` for the next version without its ``WeightsPublished`` (a crash
between the two) is redone on exactly its episode ids. Event ids derive from (run, step) and
(run, version), so a redo that re-publishes is de-duplicated by JetStream.

Sync vs async: in ``sync`` mode only samples of the current weights are used (staleness 0);
the scheduler starts the next iteration after this version is published and loaded. In
``async`` mode rollouts never wait; samples more than ``max_staleness`` versions old are left
out (they stay in the log, untrained), and ``tis_cap`` adds a truncated importance weight.
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
    CostToGoEstimated,
    EpisodeFinished,
    Event,
    InfraFailed,
    RewardAssigned,
    RunStarted,
    TeacherLabeled,
    TeacherScored,
    TrainStepFinished,
    WeightsPublished,
    derive_id,
)
from stacx.ports import WeightOffer
from stacx.train import checkpoint, lora, units
from stacx.train.batches import Query, StepBatch, scalar_rows, step_batch
from stacx.train.config import TrainerConfig
from stacx.train.distributed import RankGroup
from stacx.train.model import build, load_model, pick_device
from stacx.train.step import StepResult, train_step
from stacx.train.units import (
    gate_sql,
    pending_step_sql,
    ready_units_sql,
    trainer_state_sql,
)

# load_model, pick_device: stacx.train.model; Query, StepBatch, step_batch: stacx.train.batches
__all__ = ["Query", "StepBatch", "Trainer", "load_model", "pick_device", "step_batch"]

log = logging.getLogger(__name__)


class Trainer(Actor):
    """See the module docstring. ``Trainer(config)``, then ``run.spawn(trainer)``."""

    name: ClassVar[str] = "trainer"
    kinds: ClassVar[tuple[type[Event], ...]] = (
        RunStarted,
        EpisodeFinished,
        RewardAssigned,
        InfraFailed,
        TeacherLabeled,
        TeacherScored,
        CostToGoEstimated,
    )
    max_inflight: ClassVar[int] = 1
    ack_wait: ClassVar[float] = 120.0
    # The kinds that can complete a unit of each algorithm (stacx.train.units): only those make
    # the trainer ask the log; the others are acknowledged at once. RunStarted: a resumed run
    # re-checks at once.
    wakes: ClassVar[dict[str, tuple[type[Event], ...]]] = {
        "grpo": (RunStarted, RewardAssigned, InfraFailed),
        "sft": (RunStarted, RewardAssigned, InfraFailed),
        "dagger": (RunStarted, EpisodeFinished, RewardAssigned, TeacherLabeled, InfraFailed),
        "opd": (RunStarted, RewardAssigned, TeacherScored, InfraFailed),
        "aggrevate": (RunStarted, RewardAssigned, CostToGoEstimated, InfraFailed),
    }

    def __init__(
        self,
        config: TrainerConfig,
        *,
        model: nn.Module | None = None,
        handoff: WeightOffer | None = None,
    ) -> None:
        """``model`` (optional) is the base model to start from instead of ``config.model``;
        it is trained in place. ``handoff`` (optional) receives a snapshot of every version
        saved, for engines of this process (``trainer.inprocess_handoff``)."""
        self.config = config
        self.handoff = handoff
        self._base = model
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.version = 0
        self._pending: list[str] | None = None  # episode ids of a step to redo
        self.steps_done = 0  # steps taken by this instance (not recovered ones)
        self._loaded = -1  # the version the model in memory holds
        self._dirty = False  # a step began and did not publish: the model in memory is suspect
        self._group: RankGroup | None = None  # the ranks, when sharded (stacx.train.distributed)

    @property
    def finished(self) -> bool:
        return self.version >= self.config.steps

    # ---- recovery --------------------------------------------------------------------------

    async def on_start(self) -> None:
        rows = scalar_rows(await self.query(trainer_state_sql()))
        latest = rows[0] if rows else None
        self.version = int(latest["version"]) if latest else 0
        sql = pending_step_sql()
        pending = scalar_rows(await self.query(sql, units.params(self.config, sql, self.version)))
        self._pending = [str(e) for e in pending[0]["episode_ids"]] if pending else None
        path = str(latest["path"]) if latest else None
        await asyncio.to_thread(exclusive, self._build, path)
        log.info(
            "trainer: at version %d%s",
            self.version,
            f", redoing step {self.version + 1}" if self._pending else "",
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
        if not isinstance(event, self.wakes[self.config.algorithm]):
            return
        while not self.finished:
            episode_ids = await self._next_batch()
            if episode_ids is None:
                return
            await self._step(episode_ids)

    async def _next_batch(self) -> list[str] | None:
        if self._pending is not None:
            return self._pending
        cfg = self.config
        gate = gate_sql(cfg)
        if gate is not None:
            (row,) = scalar_rows(await self.query(gate, units.params(cfg, gate, self.version)))
            if not row["open"]:
                return None  # its iteration is still in flight: labels, scores or samples
        sql = ready_units_sql(cfg)
        ready = scalar_rows(await self.query(sql, units.params(cfg, sql, self.version)))
        if len(ready) < cfg.ready_threshold:
            return None
        chosen = ready[: cfg.batch_units]
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
        saved = time.perf_counter()
        path, sha = await asyncio.to_thread(exclusive, self._save, step, result)
        save_ms = (time.perf_counter() - saved) * 1e3
        log.info(
            "trainer: step %d on %d samples: loss %.4f, %.0f ms; checkpoint %.0f ms",
            step,
            result.n_samples,
            result.loss,
            result.duration_ms,
            save_ms,
        )
        await self.publish(self._finished(step, batch, result, episode_ids, save_ms, batch_ms))
        await self.publish(
            WeightsPublished(
                run_id=self.run_id,
                event_id=derive_id(self.run_id, "weights", step),
                version=step,
                path=str(path),
                sha256=sha,
                step=step,
                bytes=path.stat().st_size,
            )
        )
        self.version = self._loaded = step
        self._pending = None
        self._dirty = False
        self.steps_done += 1
        await asyncio.to_thread(
            checkpoint.prune,
            self.ctx.run_dir,
            step,
            keep_last=cfg.keep_last,
            save_every=cfg.save_every,
        )

    def _finished(
        self,
        step: int,
        batch: StepBatch,
        result: StepResult,
        episode_ids: list[str],
        save_ms: float,
        batch_ms: float,
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
                    "checkpoint_ms": save_ms,
                    "batch_ms": batch_ms,  # the batch's queries and samples
                    "batch_prompt_ids": batch.prompt_ids_read,
                    "max_staleness": _max_staleness(rows, self.version),
                }
            ),
            episode_ids=sorted(set(episode_ids)),
        )

    def _save(self, step: int, result: StepResult) -> tuple[Path, str]:
        assert self.model is not None and self.optimizer is not None
        meta: dict[str, object] = {
            "step": step,
            "algorithm": self.config.algorithm,
            "loss": result.loss,
            "world_size": self.config.world_size,
        }
        if self._group is not None:
            path, sha, state = self._group.save(self.ctx.run_dir, step, meta)
        elif self.config.lora is not None:  # the version is the adapter (stacx.train.lora)
            path, sha, state = lora.save(
                self.ctx.run_dir, step, self.model, self.optimizer, meta, self.config
            )
            if self.config.inprocess_handoff and self.handoff is not None:
                state = {k: v.clone() for k, v in state.items()}  # a snapshot (see below)
        else:
            path, sha = checkpoint.save(
                self.ctx.run_dir,
                step,
                self.model,
                self.optimizer,
                meta,
                only_trainable=bool(self.config.trainable),
            )
            state = {}
            if self.config.inprocess_handoff and self.handoff is not None:
                # a snapshot: the next step must not change what an engine is copying
                state = {
                    k: v.detach().clone()
                    for k, v in self.model.named_parameters()
                    if v.requires_grad or not self.config.trainable
                }
        if self.config.inprocess_handoff and self.handoff is not None:
            self.handoff.offer(str(path), sha, state)
        return path, sha


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

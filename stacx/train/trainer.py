"""The Trainer actor: readiness from the log, a step, a checkpoint, a new weight version.

Driven by the signals that can complete a unit of its algorithm (``Trainer.wakes``: rewards,
labels, scores, costs-to-go, failures): each one makes it ask the log, in SQL, whether a step
is ready (:mod:`stacx.train.units`: in sync mode the step's iteration is settled, and enough
complete units exist, each with every label, score or branch it waits for), and while one is it

1. materializes the batch from the algorithm's view (Arrow -> samples -> packed tensors; with
   ``pack_episodes`` the turns of an episode that extend each other are one sequence, rebuilt
   from the stored deltas: `step_batch`),
2. computes the loss and steps the optimizer (:mod:`stacx.train.step`, in a worker thread),
3. writes ``checkpoints/v<version>/`` (weights, optimizer state) atomically,
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import pyarrow as pa
import pyarrow.compute as pc
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
from stacx.train import checkpoint, units
from stacx.train.batches import (
    STORED_TURNS_SQL,
    chained_sequences,
    episode_sequences,
    linear_columns,
    turn_prompts,
)
from stacx.train.config import TrainerConfig
from stacx.train.distributed import RankGroup
from stacx.train.model import build, load_model, pick_device
from stacx.train.packing import Sample
from stacx.train.step import StepResult, samples_for, train_step
from stacx.train.units import (
    EPISODE_COLUMN,
    batch_rows_sql,
    gate_sql,
    pending_step_sql,
    ready_units_sql,
    trainer_state_sql,
)

__all__ = ["Trainer", "load_model", "pick_device"]  # load_model, pick_device: stacx.train.model

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
        rows = (await self.query(trainer_state_sql())).to_pylist()
        latest = rows[0] if rows else None
        self.version = int(latest["version"]) if latest else 0
        sql = pending_step_sql()
        pending = (await self.query(sql, units.params(self.config, sql, self.version))).to_pylist()
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
            (row,) = (await self.query(gate, units.params(cfg, gate, self.version))).to_pylist()
            if not row["open"]:
                return None  # its iteration is still in flight: labels, scores or samples
        sql = ready_units_sql(cfg)
        ready = (await self.query(sql, units.params(cfg, sql, self.version))).to_pylist()
        if len(ready) < cfg.ready_threshold:
            return None
        chosen = ready[: cfg.batch_units]
        return [str(e) for u in chosen for e in u["episode_ids"]]

    async def _step(self, episode_ids: list[str]) -> None:
        cfg = self.config
        read = time.perf_counter()
        batch = await step_batch(cfg, self.query, episode_ids, version=self.version)
        table, samples, n_rows = batch.table, batch.samples, batch.n_rows
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
        # the columns the lineage needs, not the token lists (a whole prompt per row)
        meta = ("episode_id", "branch_episode_id", "reward", "weight_version")
        rows = table.select([c for c in meta if c in table.column_names]).to_pylist()
        rewards = _episode_rewards(rows)
        await self.publish(
            TrainStepFinished(
                run_id=self.run_id,
                event_id=derive_id(self.run_id, "step", step),
                step=step,
                algorithm=cfg.algorithm,
                loss=result.loss,
                weight_version=step,
                reward_mean=sum(rewards) / len(rewards) if rewards else None,
                n_samples=n_rows,
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
        )
        await self.publish(
            WeightsPublished(
                run_id=self.run_id,
                event_id=derive_id(self.run_id, "weights", step),
                version=step,
                path=str(path),
                sha256=sha,
                step=step,
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


Query = Callable[[str, dict[str, object]], Awaitable[pa.Table]]


@dataclass(frozen=True)
class StepBatch:
    table: pa.Table  # the source view's rows (without prompts when read linearly)
    samples: list[Sample]  # what the step forwards: packed sequences or one per row
    n_rows: int  # the rows the step trains on
    prompt_ids_read: int  # prompt ids the queries materialized (Arrow)


async def step_batch(
    cfg: TrainerConfig, query: Query, episode_ids: list[str], *, version: int | None = None
) -> StepBatch:
    """The step's rows of the source view (``units.batch_rows_sql``) and its training samples,
    read with `query` (the actor's ``query``).

    With ``pack_episodes`` each episode's turns that extend each other are one sequence. For
    the views that take their prompts from ``turns`` (``batches.TURN_PROMPT_VIEWS``) the rows
    are read without their whole prompts and each episode's sequence is rebuilt from the
    stored deltas (``batches.chained_sequences``): Arrow, Python and the check are linear in
    the turns' stored ids. Another source view (a user's, or ``dagger_dataset``) is read with
    its whole prompts and merged by ``batches.episode_sequences``.

    GRPO and OPD samples carry each output token's weight version (token value
    ``weight_version``, from the ``turn_versions`` view: a turn generated across a weight load
    has tokens of two versions); with `version` (the trainer's), tokens more than
    ``cfg.staleness_limit`` versions behind it get loss mask 0 (the staleness bound, per token)."""
    chosen: dict[str, object] = {"episode_ids": sorted(set(episode_ids))}
    columns = linear_columns(cfg.source_view) if cfg.pack_episodes else None
    table = await query(batch_rows_sql(cfg, columns or "*"), chosen)
    samples = samples_for(cfg, table)
    if cfg.algorithm in ("grpo", "opd") and "turn" in table.column_names:
        versions = await query(TOKEN_VERSIONS_SQL, chosen)
        samples = with_token_versions(cfg, table, samples, versions, version)
    n_rows = len(samples)  # what the step trains on; packing changes the forward, not that
    read = _n_prompt_ids(table)
    if cfg.pack_episodes:
        episodes = table.column(EPISODE_COLUMN[cfg.algorithm]).to_pylist()
        if columns is None:
            samples = episode_sequences(samples, episodes)
        else:
            stored = await query(STORED_TURNS_SQL, chosen)
            read += _n_prompt_ids(stored)
            keys = list(zip(episodes, table.column("turn").to_pylist(), strict=True))
            samples = chained_sequences(samples, keys, turn_prompts(stored))
    return StepBatch(table, samples, n_rows, read)


TOKEN_VERSIONS_SQL = """
SELECT episode_id, turn, token_versions FROM turn_versions
WHERE episode_id IN (SELECT unnest($episode_ids))
"""


def with_token_versions(
    cfg: TrainerConfig,
    table: pa.Table,
    samples: list[Sample],
    versions: pa.Table,
    version: int | None,
) -> list[Sample]:
    """`samples` (one per row of `table`) with the ``weight_version`` of each completion token,
    and, given the trainer's `version`, loss mask 0 on tokens more than ``staleness_limit``
    versions older than it. A row whose stored versions do not match its completion's length
    (a view that rewrote the output) takes its row's ``weight_version`` for every token."""
    by_turn = {
        (e, t): v
        for e, t, v in zip(
            versions.column("episode_id").to_pylist(),
            versions.column("turn").to_pylist(),
            versions.column("token_versions").to_pylist(),
            strict=True,
        )
    }
    episodes = table.column(EPISODE_COLUMN[cfg.algorithm]).to_pylist()
    turns = table.column("turn").to_pylist()
    row_versions = (
        table.column("weight_version").to_pylist()
        if "weight_version" in table.column_names
        else [None] * table.num_rows
    )
    floor = None if version is None else version - cfg.staleness_limit
    out = []
    for sample, ep, turn, row_v in zip(samples, episodes, turns, row_versions, strict=True):
        n = len(sample.completion_ids)
        tv = by_turn.get((ep, turn))
        if tv is None or len(tv) != n or any(v is None for v in tv):
            tv = [row_v if row_v is not None else 0] * n
        values = {**sample.token_values, "weight_version": [float(v) for v in tv]}
        mask = sample.loss_mask
        if floor is not None and min(tv, default=floor) < floor:
            base = list(mask) if mask is not None else [1] * n
            mask = [m if v >= floor else 0 for m, v in zip(base, tv, strict=True)]
        out.append(replace(sample, token_values=values, loss_mask=mask))
    return out


def _n_prompt_ids(table: pa.Table) -> int:
    if "prompt_ids" not in table.column_names:
        return 0
    return int(pc.sum(pc.list_value_length(table.column("prompt_ids"))).as_py() or 0)


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

"""AggreVaTe: roll-ins as DAgger's, then from visited states ``branches`` explored actions each
finished by the teacher (cost-to-go); advantage-weighted log-likelihood on
``aggrevate_dataset`` (``-(Q - mean Q)`` per state). The unit is a scored roll-in parent,
complete once each of its branches has an outcome; each unit is used once."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from stacx.events import CostToGoEstimated, Event
from stacx.train.algorithms.base import Algorithm, Get, Teacher, TrainerKeys
from stacx.train.algorithms.dagger import label_actors
from stacx.train.columns import samples_from_table
from stacx.train.losses import LossOutput, advantage_weighted_loss

if TYPE_CHECKING:
    import pyarrow as pa
    from torch import Tensor

    from stacx.train.config import TrainerConfig
    from stacx.train.packing import PackedBatch, Sample


class Aggrevate(Algorithm):
    name: ClassVar[str] = "aggrevate"
    teacher: ClassVar[Teacher] = Teacher.LABEL
    roll_in: ClassVar[bool] = True
    branches: ClassVar[bool] = True
    source: ClassVar[str] = "aggrevate_dataset"
    episode_column: ClassVar[str] = "branch_episode_id"
    unit_key: ClassVar[str] = "parent_episode_id"
    row_order: ClassVar[str] = "turn, action_index"
    ready_view: ClassVar[str] = "ready_parents"
    complete: ClassVar[str] = "u.n_turns = 0 OR u.n_outcomes >= $branches"
    done: ClassVar[str] = "u.done"
    waits: ClassVar[bool] = True
    versioned: ClassVar[bool] = False
    values: ClassVar[tuple[str, ...]] = ("advantages",)
    wakes: ClassVar[tuple[type[Event], ...]] = (*Algorithm.wakes, CostToGoEstimated)

    def trainer_keys(self, get: Get) -> TrainerKeys:
        branches = get("algorithm.imitation.branches", 2)
        return {**label_actors(get), "branches": (branches, "algorithm.imitation.branches")}

    def samples(self, cfg: TrainerConfig, table: pa.Table, *, prompt: str | None) -> list[Sample]:
        return samples_from_table(
            table,
            prompt=prompt,
            completion="action_ids",
            scalar_columns={"advantages": "advantage"},
        )

    def loss(
        self, cfg: TrainerConfig, logprobs_B_T: Tensor, batch: PackedBatch, normalizer: float
    ) -> LossOutput:
        return advantage_weighted_loss(
            logprobs_B_T, batch.values_R_T["advantages"], batch.loss_mask_R_T, normalizer
        )


ALGORITHM = Aggrevate()

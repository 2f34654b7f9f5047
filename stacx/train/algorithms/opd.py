"""On-policy distillation: the student rolls in, a frozen teacher scores its tokens; clipped policy
gradient on the per-token advantage ``teacher - student`` logprob (``opd_batch``) with the
``algorithm.imitation`` knobs. The unit is a scored roll-in whose student turns all have a teacher
score (or failure); used once, within the staleness limit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stacx.events import Event, TeacherScored
from stacx.train.algorithms.base import Algorithm, Get, Teacher, TrainerKeys
from stacx.train.algorithms.grpo import policy_gradient
from stacx.train.columns import list_buffers, samples_from_table
from stacx.train.losses import LossOutput

if TYPE_CHECKING:
    from torch import Tensor

    from stacx.train.config import TrainerConfig
    from stacx.train.packing import PackedBatch, Sample

KNOBS = (("opd_discount", 0.0), ("opd_grpo_weight", 0.0), ("opd_center", False))


class Opd(Algorithm):
    name: ClassVar[str] = "opd"
    teacher: ClassVar[Teacher] = Teacher.SCORE
    teacher_role: ClassVar[bool] = True
    source: ClassVar[str] = "opd_batch"
    filter: ClassVar[str] = "aligned"
    ready_view: ClassVar[str] = "ready_roll_ins"
    complete: ClassVar[str] = "u.scored AND u.unscored = 0"
    done: ClassVar[str] = "u.scored"
    waits: ClassVar[bool] = True
    fresh_only: ClassVar[bool] = True
    token_versions: ClassVar[bool] = True
    values: ClassVar[tuple[str, ...]] = ("behavior_logprobs", "advantages")
    wakes: ClassVar[tuple[type[Event], ...]] = (*Algorithm.wakes, TeacherScored)

    def trainer_keys(self, get: Get) -> TrainerKeys:
        return {
            key: (get(f"algorithm.imitation.{key}", default), f"algorithm.imitation.{key}")
            for key, default in KNOBS
        }

    def samples(self, cfg: TrainerConfig, table: pa.Table, *, prompt: str | None) -> list[Sample]:
        table = opd_advantage_lists(
            table, discount=cfg.opd_discount, grpo_weight=cfg.opd_grpo_weight, center=cfg.opd_center
        )
        return samples_from_table(
            table,
            prompt=prompt,
            completion="output_ids",
            token_columns={"behavior_logprobs": "student_logprobs", "advantages": "advantages"},
        )

    def loss(
        self, cfg: TrainerConfig, logprobs_B_T: Tensor, batch: PackedBatch, normalizer: float
    ) -> LossOutput:
        return policy_gradient(cfg, logprobs_B_T, batch, normalizer)


ALGORITHM = Opd()


def opd_advantage_lists(
    table: pa.Table, *, discount: float = 0.0, grpo_weight: float = 0.0, center: bool = False
) -> pa.Table:
    """``opd_batch`` rows with the knobs applied to the view's ``advantages`` (the one definition of
    the log ratio); every knob off: the table as it is. Rows not ``aligned`` keep NULL."""
    if discount == 0.0 and grpo_weight == 0.0 and not center:
        return table
    import torch

    from stacx.train.advantages import opd_advantages

    aligned = np.asarray(
        table.column("aligned").fill_null(False).to_numpy(zero_copy_only=False), dtype=np.bool_
    )
    offsets, ratio, _ = list_buffers(table, "advantages")
    grpo_col = table.column("grpo_advantage").fill_null(0.0)
    rows = np.flatnonzero(aligned)
    n = np.diff(offsets)[rows]
    width = int(n.max()) if rows.size else 0
    # the [rows, width] position of each aligned row's tokens, and where it sits in the list
    r = np.repeat(np.arange(rows.size), n)
    c = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    dense = np.zeros((rows.size, width), np.float64)
    dense[r, c] = ratio[np.repeat(offsets[rows], n) + c]
    mask = torch.zeros(rows.size, width, dtype=torch.float64)
    mask[torch.from_numpy(r), torch.from_numpy(c)] = 1.0
    grpo = np.asarray(pc.cast(grpo_col, pa.float64()).to_numpy(), np.float64)[rows]
    adv = opd_advantages(
        torch.from_numpy(dense),
        mask,
        grpo_advantages_B_T=torch.from_numpy(np.repeat(grpo[:, None], width, axis=1)),
        grpo_coef=grpo_weight,
        discount=discount,
        center=center,
    ).numpy()
    lengths = np.zeros(table.num_rows, np.int64)
    lengths[rows] = n
    out = pa.ListArray.from_arrays(
        np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
        pa.array(adv[r, c], pa.float64()),
        mask=pc.invert(pa.array(aligned)),
    )
    return table.set_column(table.column_names.index("advantages"), "advantages", out)

"""On-policy distillation: the student rolls in, a frozen teacher scores the student's tokens;
clipped policy gradient with per-token advantage ``teacher - student`` logprob (``opd_batch``),
with the ``algorithm.imitation`` knobs (``opd_discount``, ``opd_center``, ``opd_grpo_weight``).
The unit is a scored roll-in episode whose student turns all have a teacher score (or a
recorded teacher failure); each unit is used once, within the staleness limit."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stacx.events import Event, InfraFailed, RewardAssigned, RunStarted, TeacherScored
from stacx.train.algorithms.base import Base, Get, Teacher, TrainerKeys
from stacx.train.algorithms.grpo import policy_gradient
from stacx.train.batches import list_buffers, samples_from_table
from stacx.train.losses import LossOutput

if TYPE_CHECKING:
    from torch import Tensor

    from stacx.train.config import TrainerConfig
    from stacx.train.packing import PackedBatch, Sample

KNOBS = (("opd_discount", 0.0), ("opd_grpo_weight", 0.0), ("opd_center", False))


class Opd(Base):
    name: ClassVar[str] = "opd"
    teacher: ClassVar[Teacher] = Teacher.SCORE
    teacher_role: ClassVar[bool] = True
    source: ClassVar[str] = "opd_batch"
    filter: ClassVar[str] = "aligned"
    complete: ClassVar[str] = "u.scored AND u.unscored = 0"
    done: ClassVar[str] = "u.scored"
    waits: ClassVar[bool] = True
    fresh_only: ClassVar[bool] = True
    token_versions: ClassVar[bool] = True
    values: ClassVar[tuple[str, ...]] = ("behavior_logprobs", "advantages")
    wakes: ClassVar[tuple[type[Event], ...]] = (
        RunStarted, RewardAssigned, TeacherScored, InfraFailed,
    )  # fmt: skip

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
    """``opd_batch`` rows with ``advantages`` recomputed by
    :func:`stacx.train.advantages.opd_advantages` (``discount``, ``center`` over the table's
    tokens, ``grpo_weight * grpo_advantage``) from the rows' ``teacher_logprobs`` and
    ``student_logprobs``. Rows that are not ``aligned`` keep NULL. This is the one OPD
    advantage the trainer uses; the view's own ``advantages`` column (the plain per-token log
    ratio) is a reading aid for users and the test oracle for every knob off."""
    import torch

    from stacx.train.advantages import opd_advantages

    aligned = np.asarray(table.column("aligned").fill_null(False).to_numpy(zero_copy_only=False),
                         dtype=np.bool_)  # fmt: skip
    s_off, student, _ = list_buffers(table, "student_logprobs")
    t_off, teacher, _ = list_buffers(table, "teacher_logprobs")
    grpo_col = table.column("grpo_advantage").fill_null(0.0)
    rows = np.flatnonzero(aligned)
    n = np.diff(s_off)[rows]  # aligned: teacher and student lists have the same lengths
    width = int(n.max()) if rows.size else 0
    # the [rows, width] position of each aligned row's tokens, and where it sits in each list
    r = np.repeat(np.arange(rows.size), n)
    c = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    dense = []
    for flat, off in ((teacher, t_off), (student, s_off)):
        m = np.zeros((rows.size, width), np.float64)
        m[r, c] = flat[np.repeat(off[rows], n) + c]
        dense.append(torch.from_numpy(m))
    mask = torch.zeros(rows.size, width, dtype=torch.float64)
    mask[torch.from_numpy(r), torch.from_numpy(c)] = 1.0
    grpo = np.asarray(pc.cast(grpo_col, pa.float64()).to_numpy(), np.float64)[rows]
    adv = opd_advantages(
        dense[0],
        dense[1],
        mask,
        grpo_advantages_B_T=torch.from_numpy(np.repeat(grpo[:, None], width, axis=1)),
        grpo_coef=grpo_weight,
        discount=discount,
        center=center,
    ).numpy()
    lengths = np.zeros(table.num_rows, np.int64)
    lengths[rows] = n
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = pa.array(adv[r, c], pa.float64())
    valid = pa.array(aligned)
    out = pa.ListArray.from_arrays(offsets, values, mask=pc.invert(valid))
    index = table.column_names.index("advantages")
    return table.set_column(index, "advantages", out)

"""RLOO (REINFORCE leave-one-out, Ahmadian et al. 2024): GRPO's groups and loss, with each
episode's advantage its reward minus the mean reward of the *other* episodes of its group,
``A_i = r_i - mean_{j != i} r_j = n / (n - 1) * (r_i - mean_j r_j)``: an unbiased baseline
(the sample's own reward is not in it), no std division. Exactly 0 for a group of one or
a group whose rewards are all equal (``grpo_batch.advantage`` is 0 there).

Read from ``grpo_batch`` (its ``advantage`` and ``group_size``); what this module adds over
``grpo`` is the advantage column, which is the whole cost of the algorithm."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stacx.train.algorithms.grpo import Grpo

if TYPE_CHECKING:
    from stacx.train.config import TrainerConfig

COLUMN = "advantage_loo"


def leave_one_out(advantage: np.ndarray, group_size: np.ndarray) -> np.ndarray:
    """``n / (n - 1) * (r - mean r)`` per row (0 where n <= 1)."""
    n = group_size.astype(np.float64)
    scale = np.divide(n, n - 1, out=np.zeros_like(n), where=n > 1)
    return advantage.astype(np.float64) * scale


class Rloo(Grpo):
    name: ClassVar[str] = "rloo"
    installed_agents: ClassVar[bool] = True

    def advantage_column(self, cfg: TrainerConfig, table: pa.Table) -> tuple[pa.Table, str]:
        adv = pc.cast(table.column("advantage"), pa.float64()).to_numpy()
        n = pc.cast(table.column("group_size"), pa.float64()).to_numpy()
        return table.append_column(COLUMN, pa.array(leave_one_out(adv, n))), COLUMN


ALGORITHM = Rloo()

"""RLOO (REINFORCE leave-one-out, Ahmadian et al. 2024): GRPO's groups and loss with the advantage
``r_i - mean_{j != i} r_j = n / (n - 1) * (r_i - mean r)`` (an unbiased baseline, no std division),
read from ``grpo_batch``; exactly 0 for a group of one or of equal rewards.
"""

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

    def advantage_column(self, cfg: TrainerConfig, table: pa.Table) -> tuple[pa.Table, str]:
        adv = pc.cast(table.column("advantage"), pa.float64()).to_numpy()
        n = pc.cast(table.column("group_size"), pa.float64()).to_numpy()
        return table.append_column(COLUMN, pa.array(leave_one_out(adv, n))), COLUMN


ALGORITHM = Rloo()

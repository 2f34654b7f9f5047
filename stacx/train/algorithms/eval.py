"""Eval: every task scored by the policy as it is; no trainer (``trains = False``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, NoReturn

from stacx.errors import StacxError
from stacx.train.algorithms.base import Base

if TYPE_CHECKING:
    import pyarrow as pa
    from torch import Tensor

    from stacx.train.config import TrainerConfig
    from stacx.train.packing import PackedBatch


class Eval(Base):
    name: ClassVar[str] = "eval"
    trains: ClassVar[bool] = False
    scripted_agents: ClassVar[bool] = True
    installed_agents: ClassVar[bool] = True

    def samples(self, cfg: TrainerConfig, table: pa.Table, *, prompt: str | None) -> NoReturn:
        raise StacxError("eval trains nothing: it has no samples")

    def loss(
        self, cfg: TrainerConfig, logprobs_B_T: Tensor, batch: PackedBatch, normalizer: float
    ) -> NoReturn:
        raise StacxError("eval trains nothing: it has no loss")


ALGORITHM = Eval()

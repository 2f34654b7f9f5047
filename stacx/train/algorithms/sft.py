"""SFT (rejection-sampling fine-tuning by default): cross-entropy on the completions of
``sft_examples`` rows that pass ``trainer.filter`` (``reward >= 1``: imitate what solved the
task). The unit is a scored episode; every complete unit stays in the dataset (epochs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from stacx.train.algorithms.base import Algorithm
from stacx.train.columns import samples_from_table
from stacx.train.losses import LossOutput, sft_loss

if TYPE_CHECKING:
    import pyarrow as pa
    from torch import Tensor

    from stacx.train.config import TrainerConfig
    from stacx.train.packing import PackedBatch, Sample


class Sft(Algorithm):
    name: ClassVar[str] = "sft"
    scripted_agents: ClassVar[bool] = True
    installed_agents: ClassVar[bool] = True
    source: ClassVar[str] = "sft_examples"
    filter: ClassVar[str] = "reward >= 1"
    dataset: ClassVar[bool] = True

    def samples(self, cfg: TrainerConfig, table: pa.Table, *, prompt: str | None) -> list[Sample]:
        return samples_from_table(
            table, prompt=prompt, completion="completion_ids", loss_mask="loss_mask"
        )

    def loss(
        self, cfg: TrainerConfig, logprobs_B_T: Tensor, batch: PackedBatch, normalizer: float
    ) -> LossOutput:
        return sft_loss(logprobs_B_T, batch.loss_mask_R_T, normalizer)


ALGORITHM = Sft()

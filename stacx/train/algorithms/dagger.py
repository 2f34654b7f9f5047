"""DAgger: beta-mixture roll-ins of student and teacher; the teacher labels every visited state
of the actors in ``teacher.label_actors``; cross-entropy on the labels of ``dagger_dataset``
(the union over all iterations: epochs over the aggregate). The unit is a roll-in episode,
complete once it ended and each of its states is labeled or its teacher failed."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from stacx.events import (
    EpisodeFinished,
    Event,
    InfraFailed,
    RewardAssigned,
    RunStarted,
    TeacherLabeled,
)
from stacx.train.algorithms.base import Base, Get, Teacher, TrainerKeys
from stacx.train.algorithms.sft import completion_samples
from stacx.train.losses import LossOutput, sft_loss

if TYPE_CHECKING:
    import pyarrow as pa
    from torch import Tensor

    from stacx.train.config import TrainerConfig
    from stacx.train.packing import PackedBatch, Sample


def label_actors(get: Get) -> TrainerKeys:
    """trainer.label_actors = teacher.label_actors (DAgger's and AggreVaTe's roll-in labels)."""
    return {
        "label_actors": (get("teacher.label_actors", ["student", "teacher"]), "teacher.label_actors")
    }


class Dagger(Base):
    name: ClassVar[str] = "dagger"
    teacher: ClassVar[Teacher] = Teacher.LABEL
    teacher_role: ClassVar[bool] = True
    roll_in: ClassVar[bool] = True
    source: ClassVar[str] = "dagger_dataset"
    filter: ClassVar[str] = "prompt_matches"
    complete: ClassVar[str] = "u.done AND NOT list_has_any(u.unlabeled_actors, $label_actors)"
    done: ClassVar[str] = "u.done"
    waits: ClassVar[bool] = True
    dataset: ClassVar[bool] = True
    wakes: ClassVar[tuple[type[Event], ...]] = (
        RunStarted, EpisodeFinished, RewardAssigned, TeacherLabeled, InfraFailed,
    )  # fmt: skip

    def trainer_keys(self, get: Get) -> TrainerKeys:
        return label_actors(get)

    def samples(self, cfg: TrainerConfig, table: pa.Table, *, prompt: str | None) -> list[Sample]:
        return completion_samples(table, prompt)

    def loss(
        self, cfg: TrainerConfig, logprobs_B_T: Tensor, batch: PackedBatch, normalizer: float
    ) -> LossOutput:
        return sft_loss(logprobs_B_T, batch.loss_mask_R_T, normalizer)


ALGORITHM = Dagger()

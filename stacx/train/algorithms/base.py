"""The `Algorithm` base class: what the launcher, the scheduler and the trainer ask of an algorithm
(its needs, readiness, source view, batch columns, loss, and the events that wake the trainer), so
that none of them branches on a name. The trainer side (``samples``, ``loss``) is only called when
``trains = True``.
Design: docs/training.md
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar

from stacx.errors import StacxError
from stacx.events import Event, InfraFailed, RewardAssigned, RunStarted

if TYPE_CHECKING:
    import pyarrow as pa
    from torch import Tensor

    from stacx.train.config import TrainerConfig
    from stacx.train.losses import LossOutput
    from stacx.train.packing import PackedBatch, Sample

# a recipe key's value by dotted path, or the default (stacx.launch.loader._get)
Get = Callable[[str, object], object]
TrainerKeys = dict[str, tuple[object, str]]  # trainer key -> (value, the recipe key it comes from)


class Teacher(StrEnum):
    """What a frozen teacher does for an algorithm."""

    NONE = ""
    LABEL = "label"  # labels visited states (DAgger's expert action)
    SCORE = "score"  # scores the student's tokens (OPD's teacher logprobs)


class Algorithm:
    """One training algorithm (or ``eval``), as the rest of STACX sees it. The defaults: trained,
    no teacher, an episode is a unit once it is scored."""

    name: ClassVar[str]
    # ---- the launcher
    trains: ClassVar[bool] = True  # False: no trainer role (eval)
    teacher: ClassVar[Teacher] = Teacher.NONE  # what the frozen teacher engine does, if any
    teacher_role: ClassVar[bool] = False  # the teacher is a role of its own (else in rollout's)
    roll_in: ClassVar[bool] = False  # rollouts are beta-mixture roll-ins with the teacher
    branches: ClassVar[bool] = False  # AggreVaTe-style branch exploration in the rollout role
    scripted_agents: ClassVar[bool] = False  # a scripted agent's (oracle, null) episodes serve it
    installed_agents: ClassVar[bool] = False  # an installed scaffold's episodes serve it

    # ---- the scheduler (readiness) and the trainer (batches)
    source: ClassVar[str] = ""  # the view it trains on (trainer.source overrides it)
    filter: ClassVar[str] = ""  # default trainer.filter over the source
    episode_column: ClassVar[str] = "episode_id"  # the source's column naming a row's episode
    unit_key: ClassVar[str] = "episode_id"  # the source's column joined to the ready view's
    row_order: ClassVar[str] = "turn"  # the source's columns after the episode that order rows
    ready_view: ClassVar[str] = "ready_episodes"  # its view in events/views/30_ready.sql
    complete: ClassVar[str] = "u.scored"  # SQL predicate over that view (alias u): unit complete
    done: ClassVar[str] = "u.scored"  # ... its rollouts ended (done, not complete: waits a signal)
    waits: ClassVar[bool] = False  # a done unit can wait for a signal (labels, scores, branches)
    versioned: ClassVar[bool] = True  # the source has weight_version (units carry a min_version)
    dataset: ClassVar[bool] = False  # trains on the aggregate of every complete unit (epochs)
    fresh_only: ClassVar[bool] = False  # units older than the staleness limit are left out
    per_group: ClassVar[bool] = False  # a unit is a group: trainer.batch_groups; sync gate on evals
    token_versions: ClassVar[bool] = False  # samples carry each token's weight version (staleness)
    values: ClassVar[tuple[str, ...]] = ()  # the per-token values its samples carry
    # event kinds that can complete one of its units
    wakes: ClassVar[tuple[type[Event], ...]] = (RunStarted, RewardAssigned, InfraFailed)

    def trainer_keys(self, get: Get) -> TrainerKeys:
        """The ``[trainer]`` keys this algorithm derives from other recipe sections."""
        return {}

    def samples(self, cfg: TrainerConfig, table: pa.Table, *, prompt: str | None) -> list[Sample]:
        """Training samples from the source view's rows (one per row)."""
        raise StacxError(f"{self.name} trains nothing: it has no samples")

    def loss(
        self, cfg: TrainerConfig, logprobs_B_T: Tensor, batch: PackedBatch, normalizer: float
    ) -> LossOutput:
        """The micro-batch's loss, normalized by ``normalizer`` loss tokens."""
        raise StacxError(f"{self.name} trains nothing: it has no loss")

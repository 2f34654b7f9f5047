"""The `Algorithm` protocol: what the launcher, the scheduler and the trainer ask of an algorithm.

Each algorithm is one module of this package holding one object that satisfies `Algorithm`:
its recipe-facing needs (a teacher, roll-ins, branches; the trainer keys other sections
decide), its readiness (a view of ``events/views/30_ready.sql`` and the predicates over it),
its source view and batch columns, its loss and the events that can complete its units. The
launcher, the scheduler and the trainer read these; none of them branches on a name.

`Base` gives the defaults (a trained, teacher-less, episode-unit algorithm); a module
overrides what differs. Limits: the trainer side (``samples``, ``loss``) is only called for
algorithms with ``trains = True``.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar, Protocol

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


class Algorithm(Protocol):
    """One training algorithm (or ``eval``), as the rest of STACX sees it."""

    name: ClassVar[str]
    # ---- the launcher
    trains: ClassVar[bool]  # False: no trainer role (eval)
    teacher: ClassVar[Teacher]  # what the frozen teacher engine does, if any
    teacher_role: ClassVar[bool]  # the teacher is a role of its own (else in the rollout role)
    roll_in: ClassVar[bool]  # rollouts are beta-mixture roll-ins with the teacher
    branches: ClassVar[bool]  # AggreVaTe-style branch exploration in the rollout role
    scripted_agents: ClassVar[bool]  # a scripted agent's (oracle, null) episodes serve it
    installed_agents: ClassVar[bool]  # an installed scaffold's episodes serve it

    def trainer_keys(self, get: Get) -> TrainerKeys:
        """The ``[trainer]`` keys this algorithm derives from other recipe sections."""
        ...

    # ---- the scheduler (readiness) and the trainer (batches)
    source: ClassVar[str]  # the view it trains on (trainer.source overrides it)
    filter: ClassVar[str]  # default trainer.filter over the source
    episode_column: ClassVar[str]  # the source's column naming a row's episode (lineage)
    unit_key: ClassVar[str]  # the source's column joined to the ready view's episode_id
    row_order: ClassVar[str]  # the source's columns after the episode that order its rows
    ready_view: ClassVar[str]  # its view in events/views/30_ready.sql
    complete: ClassVar[str]  # SQL predicate over that view (alias u): the unit is complete
    done: ClassVar[str]  # ... its rollouts ended (done and not complete: waits for a signal)
    waits: ClassVar[bool]  # a done unit can wait for a signal (labels, scores, branches)
    versioned: ClassVar[bool]  # the source has weight_version (units carry a min_version)
    dataset: ClassVar[bool]  # trains on the aggregate of every complete unit (epochs)
    fresh_only: ClassVar[bool]  # units older than the staleness limit are left out
    per_group: ClassVar[bool]  # a unit is a group: trainer.batch_groups; sync gate on evals only
    token_versions: ClassVar[bool]  # samples carry each token's weight version (staleness mask)
    values: ClassVar[tuple[str, ...]]  # the per-token values its samples carry
    wakes: ClassVar[tuple[type[Event], ...]]  # event kinds that can complete one of its units

    def samples(self, cfg: TrainerConfig, table: pa.Table, *, prompt: str | None) -> list[Sample]:
        """Training samples from the source view's rows (one per row)."""
        ...

    def loss(
        self, cfg: TrainerConfig, logprobs_B_T: Tensor, batch: PackedBatch, normalizer: float
    ) -> LossOutput:
        """The micro-batch's loss, normalized by ``normalizer`` loss tokens."""
        ...


class Base:
    """Defaults: trained, no teacher, an episode is a unit once it is scored."""

    trains: ClassVar[bool] = True
    teacher: ClassVar[Teacher] = Teacher.NONE
    teacher_role: ClassVar[bool] = False
    roll_in: ClassVar[bool] = False
    branches: ClassVar[bool] = False
    scripted_agents: ClassVar[bool] = False
    installed_agents: ClassVar[bool] = False

    source: ClassVar[str] = ""
    filter: ClassVar[str] = ""
    episode_column: ClassVar[str] = "episode_id"
    unit_key: ClassVar[str] = "episode_id"
    row_order: ClassVar[str] = "turn"
    ready_view: ClassVar[str] = "ready_episodes"
    complete: ClassVar[str] = "u.scored"
    done: ClassVar[str] = "u.scored"
    waits: ClassVar[bool] = False
    versioned: ClassVar[bool] = True
    dataset: ClassVar[bool] = False
    fresh_only: ClassVar[bool] = False
    per_group: ClassVar[bool] = False
    token_versions: ClassVar[bool] = False
    values: ClassVar[tuple[str, ...]] = ()
    wakes: ClassVar[tuple[type[Event], ...]] = (RunStarted, RewardAssigned, InfraFailed)

    def trainer_keys(self, get: Get) -> TrainerKeys:
        return {}

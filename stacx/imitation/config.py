"""The imitation engine's configuration: the frozen teacher (``[teacher]``) and the imitation
algorithm (``[algorithm.imitation]``), frozen Structs that forbid unknown keys.
Design: docs/training.md#imitation-roll-ins-teacher-signals-branches
"""

from __future__ import annotations

from typing import Literal

import msgspec

from stacx.errors import ConfigError

ImitationAlgorithm = Literal["dagger", "aggrevate", "opd"]


class TeacherConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The frozen teacher: which checkpoint, which backend, how it labels (``sglang``/``openai``:
    ``url`` names the running server)."""

    # an HF checkpoint directory (e.g. ``stacx models export`` of a run of
    # recipes/imitation/teacher.toml), a hub id in the local cache, or "default"
    path: str = ""
    name: str = "teacher"  # recorded in TeacherLabeled.teacher / TeacherScored.teacher
    backend: Literal["torch", "sglang", "openai"] = "torch"
    device: Literal["cpu", "cuda", "auto"] = "auto"
    url: str = ""  # sglang / openai: an already running server
    max_batch: int = 8
    max_len: int = 8192
    temperature: float = 0.0  # DAgger labels: the teacher's best guess (greedy) by default
    max_new_tokens: int = 256
    # Which executed turns get a label. DAgger labels every state the roll-in visited; turns the
    # teacher itself executed are labeled too by default (the paper's aggregate dataset).
    label_actors: list[str] = msgspec.field(default_factory=lambda: ["student", "teacher"])


class ImitationConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """DAgger / AggreVaTe / OPD: roll-in schedule and AggreVaTe's branching."""

    name: ImitationAlgorithm = "dagger"
    iterations: int = 1
    beta0: float = 0.5  # teacher probability per turn at iteration 0 (dagger, aggrevate)
    beta_decay: float = 0.5
    beta_min: float = 0.0
    branches: int = 2  # aggrevate: k exploration actions from the learner per sampled turn
    exploration_temperature: float = 1.0  # aggrevate: the learner's exploration sampling
    opd_grpo_weight: float = 0.0  # opd: weight of the GRPO advantage mixed in
    # opd: 0 scores each token by its own teacher-student log ratio; 1 by the sum over it and the
    # turn's later tokens (the turn's reverse KL; see stacx.train.advantages.opd_advantages)
    opd_discount: float = 0.0
    opd_center: bool = False  # opd: subtract the batch's mean log-ratio advantage (a baseline)
    seed: int = 0  # roll-in coin flips and AggreVaTe's choice of turn derive from it

    def __post_init__(self) -> None:
        for key in ("beta0", "beta_decay", "beta_min", "opd_discount"):
            value = getattr(self, key)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(
                    f"algorithm.imitation.{key} = {value}: accepted values are in [0, 1]"
                )
        if self.branches < 1:
            raise ConfigError(f"algorithm.imitation.branches = {self.branches}: must be >= 1")
        if self.iterations < 1:
            raise ConfigError(f"algorithm.imitation.iterations = {self.iterations}: must be >= 1")

    def beta(self, iteration: int) -> float:
        return beta_at(iteration, self.beta0, self.beta_decay, self.beta_min)


def beta_at(iteration: int, beta0: float, beta_decay: float, beta_min: float = 0.0) -> float:
    """``max(beta_min, beta0 * beta_decay ** iteration)``; iteration 0 gives ``beta0``."""
    if iteration < 0:
        raise ConfigError(f"iteration {iteration}: must be >= 0")
    return max(beta_min, beta0 * beta_decay**iteration)

"""The training algorithms, one module each (see `base.Algorithm`), by recipe name, and what a
`TrainerConfig` means under its algorithm (`algorithm_for`). A new one is a module satisfying `base.Algorithm` (plus, for a new kind of unit, a view in
``events/views/30_ready.sql``) and its line in `_MODULES`.
"""

from __future__ import annotations

from typing import Final

from stacx.errors import ConfigError
from stacx.train.algorithms import aggrevate, dagger, grpo, opd, rloo, sft
from stacx.train.algorithms import eval as evaluation
from stacx.train.algorithms.base import Algorithm, Teacher
from stacx.train.config import TrainerConfig, config_error

__all__ = [
    "ALGORITHMS",
    "TRAINED",
    "Algorithm",
    "Teacher",
    "algorithm_for",
    "batch_units",
    "get",
    "ready_threshold",
    "row_filter",
    "source_view",
]

_MODULES: Final = (sft, grpo, dagger, aggrevate, opd, rloo, evaluation)
ALGORITHMS: Final[dict[str, Algorithm]] = {m.ALGORITHM.name: m.ALGORITHM for m in _MODULES}
TRAINED: Final = tuple(name for name, a in ALGORITHMS.items() if a.trains)


def get(name: str, key: str = "algorithm.name") -> Algorithm:
    """The algorithm called `name`; ConfigError naming `key` and the accepted names otherwise."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ConfigError(
            f"{key} = {name!r}: accepted values are {', '.join(map(repr, ALGORITHMS))}"
        ) from None


def algorithm_for(cfg: TrainerConfig) -> Algorithm:
    """The algorithm `cfg` trains. A ConfigError names the key when the name is not a trained
    algorithm, or `cfg` asks what the algorithm cannot do (epochs of a use-once algorithm,
    ``min_ready`` above its batch); `TrainerConfig` checks every other key itself."""
    a = ALGORITHMS.get(cfg.algorithm)
    if a is None or not a.trains:
        raise config_error("algorithm", cfg.algorithm, " | ".join(TRAINED))
    if cfg.steps_per_iteration > 1 and not a.dataset:
        raise config_error(
            "steps_per_iteration",
            cfg.steps_per_iteration,
            f"1 for {cfg.algorithm} (it uses each unit once; only the dataset algorithms "
            "(sft, dagger) train epochs over an aggregate dataset)",
        )
    units = _batch_units(cfg, a)
    if cfg.min_ready is not None and not 1 <= cfg.min_ready <= units:
        raise config_error("min_ready", cfg.min_ready, f"an integer in [1, batch size {units}]")
    return a


def source_view(cfg: TrainerConfig) -> str:
    """The view the trainer reads: ``trainer.source``, else the algorithm's."""
    return cfg.source or algorithm_for(cfg).source


def row_filter(cfg: TrainerConfig) -> str:
    """The SQL filter over the source's rows: ``trainer.filter``, else the algorithm's."""
    return cfg.filter or algorithm_for(cfg).filter


def batch_units(cfg: TrainerConfig) -> int:
    """Units per step: groups for a per-group algorithm (GRPO), else episodes."""
    return _batch_units(cfg, algorithm_for(cfg))


def ready_threshold(cfg: TrainerConfig) -> int:
    """Complete units needed before a step: ``trainer.min_ready``, else a full batch."""
    return cfg.min_ready if cfg.min_ready is not None else batch_units(cfg)


def _batch_units(cfg: TrainerConfig, a: Algorithm) -> int:
    return cfg.batch_groups if a.per_group else cfg.batch_episodes

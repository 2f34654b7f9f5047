"""The training algorithms, one module each (see `base.Algorithm`), by recipe name.

Adding an algorithm is a module here that satisfies `base.Algorithm` (and, if it needs a new
kind of unit, a view in ``events/views/30_ready.sql``), plus its line in `_MODULES`."""

from __future__ import annotations

from typing import Final

from stacx.errors import ConfigError
from stacx.train.algorithms import aggrevate, dagger, grpo, opd, rloo, sft
from stacx.train.algorithms import eval as evaluation
from stacx.train.algorithms.base import Algorithm, Teacher

__all__ = ["ALGORITHMS", "TRAINED", "Algorithm", "Teacher", "get"]

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

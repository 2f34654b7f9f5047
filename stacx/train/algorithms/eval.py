"""Eval: every task scored by the policy as it is; no trainer (``trains = False``: the base class's
``samples`` and ``loss`` refuse)."""

from __future__ import annotations

from typing import ClassVar

from stacx.train.algorithms.base import Algorithm


class Eval(Algorithm):
    name: ClassVar[str] = "eval"
    trains: ClassVar[bool] = False
    scripted_agents: ClassVar[bool] = True
    installed_agents: ClassVar[bool] = True


ALGORITHM = Eval()

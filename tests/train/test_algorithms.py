"""The algorithms are modules (stacx.train.algorithms): nothing outside them branches on an
algorithm's name, and each one says what the launcher needs of it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from stacx.errors import ConfigError
from stacx.train import algorithms
from stacx.train.algorithms import Teacher

STACX = Path(__file__).resolve().parents[2] / "stacx"


def name_branches(tree: ast.AST) -> list[int]:
    """Lines that compare with an algorithm's name, or key a table by two or more of them."""
    names = set(algorithms.ALGORITHMS)

    def named(node: ast.expr) -> list[str]:
        elts = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
        return [e.value for e in elts if isinstance(e, ast.Constant) and e.value in names]

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(named(c) for c in [node.left, *node.comparators]):
            lines.append(node.lineno)
        if isinstance(node, ast.Dict) and len([k for k in node.keys if k and named(k)]) > 1:
            lines.append(node.lineno)
    return lines


def test_nothing_outside_the_algorithms_branches_on_a_name() -> None:
    found = {
        str(path.relative_to(STACX)): lines
        for path in STACX.rglob("*.py")
        if "algorithms" not in path.parts and (lines := name_branches(ast.parse(path.read_text())))
    }
    assert found == {}
    # the walk sees a branch where there is one
    assert name_branches(ast.parse("if cfg.algorithm in ('dagger', 'opd'):\n    pass")) == [1]


def test_each_algorithm_says_what_the_launcher_needs() -> None:
    a = algorithms.ALGORITHMS
    assert [n for n in a if not a[n].trains] == ["eval"]
    assert {n for n in a if a[n].teacher != Teacher.NONE} == {"dagger", "aggrevate", "opd"}
    assert {n for n in a if a[n].teacher_role} == {"dagger", "opd"}  # AggreVaTe's in rollouts
    assert {n for n in a if a[n].roll_in} == {"dagger", "aggrevate"}
    assert a["rloo"].ready_view == a["grpo"].ready_view and a["rloo"].per_group
    with pytest.raises(ConfigError, match=r"algorithm.name = 'ppo': accepted values are 'sft'"):
        algorithms.get("ppo")

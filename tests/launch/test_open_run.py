"""One way to open a run (issue 44, STYLE's "one path"): only the launcher's `open_run` builds a
RunContext, so `stacx run`, `eval`, `replay`, `regrade`, `import harbor` and the benches all open
and continue runs under the same resume rules (a live launcher or another recipe is refused)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from stacx.errors import ConfigError
from stacx.launch.launcher import open_run

ROOT = Path(__file__).resolve().parents[2]
# the module that defines it, and the one way in
OPENERS = {"stacx/actors/run.py", "stacx/launch/launcher.py"}


def run_contexts_built(tree: ast.AST) -> list[int]:
    """Lines that call RunContext(...) (by name or as an attribute)."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id == "RunContext")
            or (isinstance(node.func, ast.Attribute) and node.func.attr == "RunContext")
        )
    ]


@pytest.mark.parametrize("root", ["stacx", "tools"])
def test_only_the_launcher_opens_a_run(root: str) -> None:
    found = {
        rel: lines
        for path in sorted((ROOT / root).rglob("*.py"))
        if (rel := str(path.relative_to(ROOT))) not in OPENERS
        and (lines := run_contexts_built(ast.parse(path.read_text())))
    }
    assert found == {}
    # the walk sees a construction where there is one
    assert run_contexts_built(
        ast.parse("async def f():\n async with RunContext(d) as r: pass")
    ) == [2]


async def test_open_run_refuses_a_log_of_another_recipe(tmp_path: Path) -> None:
    async with open_run(tmp_path, "a", {"name": "a"}) as (run, previous):
        assert previous is None
        first = run.run_id
    async with open_run(tmp_path, "a", {"name": "a"}, attempt={"note": 1}) as (run, previous):
        assert previous is not None and previous.run_id == first == run.run_id
    with pytest.raises(ConfigError, match="different recipe"):
        async with open_run(tmp_path, "b", {"name": "b"}):
            pass

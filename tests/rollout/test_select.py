"""Which tasks an eval runs: a dir, a tasks.jsonl, a bundled name; --limit; oracle needs solutions."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from stacx.cli.eval import resolve_tasks
from stacx.errors import ConfigError
from stacx.rollout.evaluate import EvalConfig, select_tasks
from stacx.sandbox.tasks import discover, write_jsonl

BASIC = Path(__file__).resolve().parents[2] / "recipes" / "tasks" / "basic"


def test_bundled_name_dir_and_jsonl_select_the_same_tasks(tmp_path: Path) -> None:
    assert resolve_tasks("basic") == BASIC
    jsonl = tmp_path / "tasks.jsonl"
    write_jsonl(discover(BASIC)[:3], jsonl)
    from_dir, _ = select_tasks(EvalConfig(tasks=str(resolve_tasks(str(BASIC))), limit=3))
    from_jsonl, _ = select_tasks(EvalConfig(tasks=str(resolve_tasks(str(jsonl)))))
    assert [t.task_id for t in from_dir] == [t.task_id for t in from_jsonl]
    assert len(from_dir) == 3


def test_unknown_tasks_spec_names_the_bundled_sets() -> None:
    with pytest.raises(ConfigError, match=r"bundled: .*basic"):
        resolve_tasks("nope")


def test_oracle_skips_tasks_without_a_solution(tmp_path: Path) -> None:
    for name in ("write-answer-42", "sort-names"):
        shutil.copytree(BASIC / name, tmp_path / name)
    (tmp_path / "sort-names" / "solution" / "solve.sh").unlink()
    tasks, skipped = select_tasks(EvalConfig(tasks=str(tmp_path), agent="oracle"))
    assert [t.task_id for t in tasks] == ["write-answer-42"] and skipped == ["sort-names"]
    (tmp_path / "write-answer-42" / "solution" / "solve.sh").unlink()
    with pytest.raises(ConfigError, match=r"no task .* has solution/solve.sh"):
        select_tasks(EvalConfig(tasks=str(tmp_path), agent="oracle"))

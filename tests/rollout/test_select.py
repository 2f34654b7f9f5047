"""Which tasks an eval runs (the launcher's selection, for `stacx eval` and eval recipes alike):
a dir, a tasks.jsonl, a bundled name; --limit; the oracle needs solutions."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from stacx.cli.eval import resolve_tasks
from stacx.errors import ConfigError
from stacx.harbor.jsonl_tasks import write_jsonl
from stacx.harbor.tasks import discover
from stacx.launch.launcher import selection
from stacx.launch.presets import eval_recipe

BASIC = Path(__file__).resolve().parents[2] / "recipes" / "tasks" / "basic"


def test_bundled_name_dir_and_jsonl_select_the_same_tasks(tmp_path: Path) -> None:
    assert resolve_tasks("basic") == BASIC
    jsonl = tmp_path / "tasks.jsonl"
    write_jsonl(discover(BASIC)[:3], jsonl)
    from_dir = selection(eval_recipe(tasks=str(resolve_tasks(str(BASIC))), limit=3))[0]
    from_jsonl = selection(eval_recipe(tasks=str(resolve_tasks(str(jsonl)))))[0]
    assert [t.task_id for t in from_dir] == [t.task_id for t in from_jsonl]
    assert len(from_dir) == 3


def test_unknown_tasks_spec_names_the_bundled_sets() -> None:
    with pytest.raises(ConfigError, match=r"--tasks 'nope'.*bundled: .*basic"):
        resolve_tasks("nope")


def test_oracle_skips_tasks_without_a_solution(tmp_path: Path) -> None:
    for name in ("write-answer-42", "sort-names"):
        shutil.copytree(BASIC / name, tmp_path / name)
    (tmp_path / "sort-names" / "solution" / "solve.sh").unlink()
    recipe = eval_recipe(tasks=str(tmp_path), agent="oracle")
    assert [t.task_id for t in selection(recipe)[0]] == ["write-answer-42"]
    assert selection(recipe)[1] == ["sort-names"]  # the tasks an oracle run leaves out
    assert len(selection(eval_recipe(tasks=str(tmp_path), agent="null"))[0]) == 2
    (tmp_path / "write-answer-42" / "solution" / "solve.sh").unlink()
    with pytest.raises(
        ConfigError, match=r"agent.name = 'oracle': no selected task in .*solve\.sh"
    ):
        selection(recipe)[0]

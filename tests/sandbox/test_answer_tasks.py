"""Answer tasks in the light .jsonl format (stacx.harbor.tasks), and the bundled math set."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from stacx.errors import TaskError
from stacx.harbor.jsonl_tasks import ANSWER_PATH
from stacx.harbor.tasks import discover, load_task, load_tasks, select

ROOT = Path(__file__).resolve().parents[2]
ARITH = ROOT / "recipes" / "tasks" / "math"


def write(path: Path, *records: dict[str, object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_jsonl_lines_become_tasks_that_load_back_by_path(tmp_path: Path) -> None:
    f = write(
        tmp_path / "aime.jsonl",
        {"id": "a1", "problem": "Find x.", "answer": 204, "difficulty": "hard"},
        {"id": "a2", "problem": "Find y.", "answer": "3/4"},
    )
    a1, a2 = load_tasks(f)
    assert (a1.task_id, a1.instruction) == ("a1", "Find x.")
    assert a1.config.metadata == {"answer": "204", "answer_path": ANSWER_PATH, "difficulty": "hard"}
    assert "difficulty" not in a2.config.metadata and a2.config.metadata["answer"] == "3/4"
    assert a1.path == f"{f.resolve()}#a1"
    assert load_task(a2.path) == a2  # what Environments.task(TaskScheduled.task_path) does
    assert not a1.config.environment.allow_internet
    assert [t.task_id for t in select([a1, a2], difficulty=["hard"])] == ["a1"]


def test_unknown_id_and_bad_lines_are_task_errors(tmp_path: Path) -> None:
    f = write(tmp_path / "s.jsonl", {"id": "a", "problem": "p", "answer": "1"})
    with pytest.raises(TaskError, match="no task with id 'b'"):
        load_task(f"{f}#b")
    bad = write(tmp_path / "bad.jsonl", {"id": "a", "problem": "p", "answer": "1", "hint": "x"})
    with pytest.raises(TaskError, match=r"bad\.jsonl:1"):
        load_tasks(bad)
    (tmp_path / "nojson.jsonl").write_text('{"id": "a", "problem": "p"}\n')
    with pytest.raises(TaskError, match=r"nojson\.jsonl:1"):
        load_tasks(tmp_path / "nojson.jsonl")


def test_a_dir_of_jsonl_files_is_one_task_set(tmp_path: Path) -> None:
    write(tmp_path / "a.jsonl", {"id": "x", "problem": "p", "answer": "1"})
    write(tmp_path / "b.jsonl", {"id": "y", "problem": "q", "answer": "2"})
    assert [t.task_id for t in discover(tmp_path)] == ["x", "y"]
    write(tmp_path / "c.jsonl", {"id": "x", "problem": "r", "answer": "3"})
    with pytest.raises(TaskError, match="duplicate task id 'x'"):
        discover(tmp_path)


def test_bundled_arith_set_has_tiers_splits_and_true_answers() -> None:
    tasks = load_tasks(ARITH)
    counts = Counter((t.task_id.split("-")[0], t.config.metadata["difficulty"]) for t in tasks)
    assert counts == {
        ("train", "trivial"): 80,
        ("heldout", "trivial"): 20,
        ("train", "easy"): 200,
        ("heldout", "easy"): 50,
        ("train", "medium"): 200,
        ("heldout", "medium"): 50,
    }
    splits: dict[str, set[str]] = {"train": set(), "heldout": set()}
    for t in tasks:
        splits[t.task_id.split("-")[0]].add(t.instruction)
        if t.config.metadata["difficulty"] != "medium":  # "What is 47 - 58?"
            expr = t.instruction.removeprefix("What is ").removesuffix("?")
            assert str(eval(expr)) == t.config.metadata["answer"], t.task_id
    assert not splits["train"] & splits["heldout"]
    assert select(tasks, include=["heldout-*"], difficulty=["trivial"])[0].task_id.startswith(
        "heldout-trivial-"
    )


def test_bundled_arith_set_is_what_the_generator_writes() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "make_arith.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr

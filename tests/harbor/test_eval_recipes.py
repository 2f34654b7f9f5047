"""The benchmark eval recipes (recipes/eval/: SWE-bench Verified, Terminal-Bench 2, SWE-Gym Lite,
AIME) load, and plan once their tree is downloaded: each recipe's own header commands
(`stacx tasks download NAME@VERSION -o DIR`, `stacx tasks prepare DIR -o JSONL`) run as written
against a local registry that holds a dataset of that name and version (one fixture task from a
local git repo), then `stacx run RECIPE --dry-run` in the same directory schedules it. The real
benchmarks are not fetched (no internet here)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from stacx.launch.loader import load_recipe

from .conftest import FIXTURES, stacx

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ["swebench_verified", "terminal_bench_2", "swegym_lite", "aime"]


def header_commands(recipe: Path) -> list[list[str]]:
    """The `stacx tasks ...` command lines of a recipe's header comment."""
    lines = [
        ln.lstrip("# ").strip() for ln in recipe.read_text().splitlines() if ln.startswith("#")
    ]
    return [shlex.split(ln)[2:] for ln in lines if re.match(r"stacx tasks (download|prepare) ", ln)]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """registry.json naming every benchmark's NAME@VERSION, each one task from a local git repo."""
    tmp = tmp_path_factory.mktemp("registry")
    repo = tmp / "repo"
    shutil.copytree(FIXTURES / "mixed" / "hello", repo / "hello")
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "v1"]):
        subprocess.run([*git, *args], cwd=repo, check=True, capture_output=True)
    commit = subprocess.run(
        [*git, "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()
    entries = []
    for bench in BENCHMARKS:
        (spec,) = [
            c[1]
            for c in header_commands(ROOT / "recipes/eval" / f"{bench}.toml")
            if c[0] == "download"
        ]
        name, version = spec.split("@")
        entries.append(
            {
                "name": name,
                "version": version,
                "description": bench,
                "tasks": [
                    {
                        "name": "hello",
                        "git_url": repo.as_uri(),
                        "git_commit_id": commit,
                        "path": "hello",
                    }
                ],
            }
        )
    (tmp / "registry.json").write_text(json.dumps(entries))
    return tmp / "registry.json"


@pytest.mark.parametrize("bench", BENCHMARKS)
def test_benchmark_recipe_plans_after_its_own_download_commands(
    bench: str, registry: Path, tmp_path: Path
) -> None:
    recipe_path = ROOT / "recipes/eval" / f"{bench}.toml"
    recipe = load_recipe(recipe_path)
    assert recipe.is_eval
    commands = header_commands(recipe_path)
    assert [c[0] for c in commands] == ["download", "prepare"]
    prepared = commands[1][commands[1].index("-o") + 1]
    assert recipe.tasks.path == prepared  # the recipe reads what its header writes
    for command in commands:
        extra = ["--registry", str(registry), "--cache", str(tmp_path / "cache")]
        done = stacx("tasks", *command, *(extra if command[0] == "download" else []), cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
    done = stacx("run", recipe_path, "--dry-run", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"schedule: eval, 1 tasks x {recipe.tasks.group_size} samples" in done.stdout

"""`stacx tasks download NAME@VERSION`: Harbor's registry.json and dataset.toml resolved to
tasks fetched from git at their pinned commits (a local git repo made here, file:// URLs)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import FIXTURES, stacx


def _git(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str, str]:
    """A git repo of two tasks; (repo, first commit, second commit: hello's instruction changed)."""
    repo = tmp_path / "repo"
    for name in ("hello", "two-steps"):
        shutil.copytree(FIXTURES / "mixed" / name, repo / "tasks" / name)
    _git("init", "-q", cwd=repo)
    _git("add", "-A", cwd=repo)
    _git("commit", "-qm", "v1", cwd=repo)
    first = _git("rev-parse", "HEAD", cwd=repo)
    (repo / "tasks" / "hello" / "instruction.md").write_text("changed after v1\n")
    _git("commit", "-qam", "v2", cwd=repo)
    return repo, first, _git("rev-parse", "HEAD", cwd=repo)


def _registry(tmp_path: Path, repo: Path, commit: str) -> Path:
    url = repo.as_uri()
    reg = tmp_path / "registry.json"
    reg.write_text(
        json.dumps(
            [
                {
                    "name": "demo",
                    "version": "1.0",
                    "description": "d",
                    "tasks": [
                        {
                            "name": "hello",
                            "git_url": url,
                            "git_commit_id": commit,
                            "path": "tasks/hello",
                        },
                        {
                            "name": "two-steps",
                            "git_url": url,
                            "git_commit_id": commit,
                            "path": "tasks/two-steps",
                        },
                    ],
                }
            ]
        )
    )
    return reg


def test_download_fetches_each_task_at_its_commit_with_a_cache(
    tmp_path: Path, repo: tuple[Path, str, str]
) -> None:
    path, first, _ = repo
    reg, out, cache = _registry(tmp_path, path, first), tmp_path / "D", tmp_path / "cache"
    done = stacx("tasks", "download", "demo@1.0", "--registry", reg, "-o", out, "--cache", cache)
    assert done.returncode == 0, done.stderr
    assert "2 task(s)" in done.stdout and "(0 from the cache)" in done.stdout
    # the pinned commit, not the branch head
    assert (out / "hello" / "instruction.md").read_text().startswith('Write "hello"')
    assert (out / "two-steps" / "steps" / "extend" / "tests" / "test.sh").is_file()
    again = stacx("tasks", "download", "demo@1.0", "--registry", reg, "-o", out, "--cache", cache)
    assert "(2 from the cache)" in again.stdout
    prepared = stacx("tasks", "prepare", out, "-o", tmp_path / "tasks.jsonl")
    assert prepared.returncode == 0 and "wrote 2 task(s)" in prepared.stdout


def test_task_names_file_and_a_dataset_toml_manifest(
    tmp_path: Path, repo: tuple[Path, str, str]
) -> None:
    path, _, second = repo
    manifest = tmp_path / "dataset.toml"
    manifest.write_text(
        '[dataset]\nname = "demo"\nversion = "2.0"\n\n'
        f'[[tasks]]\nname = "hello"\ngit_url = "{path.as_uri()}"\n'
        f'git_commit_id = "{second}"\npath = "tasks/hello"\n\n'
        f'[[tasks]]\nname = "two-steps"\ngit_url = "{path.as_uri()}"\n'
        f'git_commit_id = "{second}"\npath = "tasks/two-steps"\n'
    )
    names = tmp_path / "names.txt"
    names.write_text("hello\n")
    out = tmp_path / "D"
    done = stacx(
        "tasks",
        "download",
        "demo@2.0",
        "--registry",
        manifest,
        "-o",
        out,
        "--task-names-file",
        names,
        "--cache",
        tmp_path / "cache",
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["hello"]
    assert (out / "hello" / "instruction.md").read_text() == "changed after v1\n"


def test_unknown_version_names_the_known_ones(tmp_path: Path, repo: tuple[Path, str, str]) -> None:
    reg = _registry(tmp_path, repo[0], repo[1])
    done = stacx("tasks", "download", "demo@9", "--registry", reg, "-o", tmp_path / "D")
    assert done.returncode != 0 and "no version '9'; known: 1.0" in done.stderr

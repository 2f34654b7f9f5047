"""Tasks others wrote score the same on a fresh host: tests/harbor/fixtures/third-party (wheels
pinned for 3.12, ubuntu:24.04 with an apt package only Ubuntu has, Compose's build.dockerfile /
args / target, pytest baked into the image) all score 1 with the oracle, built from a Docker
state without their images and without stacx/base:noble, which the first task that needs it
builds (tests/conftest.py's FIRST runs this file before any other, so a CI run builds noble
once).
Skipped, saying why, where Ubuntu's archive does not answer."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from pathlib import Path

import pytest

from stacx.cli.tasks import warned
from stacx.launch.presets import check_tasks
from stacx.sandbox.images import NOBLE_IMAGE, archive_answers, image_exists

from .conftest import FIXTURES

SET = FIXTURES / "third-party"
pytestmark = pytest.mark.docker


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=False).stdout


def _forget_images(task_ids: list[str]) -> str | None:
    """Remove the set's task images and untag stacx/base:noble (kept under a throwaway tag,
    so images other tests built on it stay valid); the throwaway tag, or None."""
    for task_id in task_ids:
        ids = _docker("images", "-q", "--filter", f"label=stacx.task={task_id}").split()
        if ids:
            _docker("rmi", "-f", *set(ids))
    if not image_exists(NOBLE_IMAGE):
        return None
    keep = f"stacx/test-kept-noble:{uuid.uuid4().hex[:8]}"
    _docker("tag", NOBLE_IMAGE, keep)
    _docker("rmi", NOBLE_IMAGE)
    return keep


def test_third_party_tasks_score_1_from_a_fresh_docker_state(
    tmp_path: Path, base_images: object, capfd: pytest.CaptureFixture[str]
) -> None:
    if (why := archive_answers("noble")) is not None:
        pytest.skip(f"{NOBLE_IMAGE} cannot be built here: {why}")
    tasks = sorted(p.name for p in SET.iterdir() if (p / "task.toml").is_file())
    kept = _forget_images(tasks)
    try:
        run_dir, rows = asyncio.run(check_tasks(SET, "oracle", run_dir=tmp_path / "run"))
    finally:
        if kept is not None:
            _docker("rmi", kept)  # refused while a kept image has children: left, harmless
    assert {r.task_id: (r.reward, r.failure) for r in rows} == {t: (1.0, None) for t in tasks}
    assert image_exists(NOBLE_IMAGE)
    # the warnings are events of the run, as `stacx tasks check` prints them
    assert warned(run_dir) == [
        (
            "numpy-pinned-312",
            "python:3.12-slim-bookworm runs on stacx/base:noble (Ubuntu noble, not bookworm)",
        ),
        (
            "pytest-in-image",
            "task.toml: environment.build_timeout: unknown key, ignored (did you "
            "mean 'build_timeout_sec'?)",
        ),
    ]
    assert (
        f"building base image {NOBLE_IMAGE} (Ubuntu noble, Python 3.12)" in capfd.readouterr().err
    )

"""Offline stand-ins built from the package registry (stacx.sandbox.standins): uv's images.
`COPY --from=ghcr.io/astral-sh/uv:0.9.7` and `FROM ghcr.io/astral-sh/uv:0.9.7-python3.12-...`
build through `stacx tasks check` on real Docker with the uv 0.9.7 binaries of PyPI's wheel;
the variant's base mapping (python:3.12-slim-bookworm on Ubuntu noble) is warned on the episode."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import aiodocker
import pytest

from stacx.errors import TaskError
from stacx.launch.presets import check_tasks
from stacx.sandbox.aliases import AliasMap
from stacx.sandbox.standins import UV_REPO, ensure_standin, standin, standin_base

from .conftest import FIXTURES
from .test_harbor_tasks import by_task, rows


def test_which_uv_images_have_a_stand_in_and_on_what() -> None:
    assert standin("ghcr.io/astral-sh/uv:latest") == "stacx/standin-uv:latest"
    assert standin_base("stacx/standin-uv:0.9.7") is None  # FROM scratch, as upstream
    assert standin_base("stacx/standin-uv:0.9-python3.12-bookworm-slim") == (
        "python:3.12-slim-bookworm"
    )
    assert standin_base("stacx/standin-uv:debian") == "debian:trixie"
    assert standin("ghcr.io/astral-sh/uv:0.9.7-alpine") is None  # no alpine here
    assert standin("ghcr.io/other/uv:latest") is None
    aliases = AliasMap(exists=lambda _image: True)
    assert aliases.resolve("ghcr.io/astral-sh/uv:0.9.7@sha256:" + "0" * 64) == (
        "stacx/standin-uv:0.9.7"
    )


@pytest.mark.docker
def test_uv_images_are_rebuilt_from_pypi(tmp_path: Path, base_images: object) -> None:
    run_dir, found = asyncio.run(
        check_tasks(FIXTURES / "standins", "oracle", run_dir=tmp_path / "run")
    )
    failures = dict(
        rows(
            run_dir,
            "select s.task_id, f.message from infra_failed f "
            "join episode_started s using (episode_id)",
        )
    )
    if any("from the package index" in str(m) for m in failures.values()):
        pytest.skip(f"no package index reachable: {failures}")
    out = by_task(run_dir, "verifier_output", "reward_assigned")
    assert {r.task_id: r.reward for r in found} == {"uv-copy-from": 1.0, "uv-variant": 1.0}, (
        out,
        failures,
    )
    assert "uv 0.9.7" in str(out["uv-copy-from"])
    assert "uv at /usr/local/bin/uv: uv 0.9.7" in str(out["uv-variant"])
    warned = dict(rows(run_dir, "select task_id, message from episode_warned"))
    assert "is uv from PyPI on top of" in str(warned["uv-variant"])
    assert "runs on stacx/base:noble (Ubuntu noble, not bookworm)" in str(warned["uv-variant"])


@pytest.mark.docker
async def test_a_missing_stand_in_is_built() -> None:
    # a tag of its own: the images above stay cached between runs, and would hide the build
    tag = f"stacx/standin-test-{uuid.uuid4().hex[:12]}:0.9.7"
    async with aiodocker.Docker() as docker:
        try:
            await ensure_standin(docker, tag, None, task="standin-test")
        except TaskError as exc:
            if "from the package index" in str(exc):
                pytest.skip(f"no package index reachable: {exc}")
            raise
        try:
            info = await docker.images.inspect(tag)
            assert info["Config"]["Labels"]["stacx.standin"] == f"{UV_REPO}:0.9.7"
        finally:
            await docker.images.delete(tag, force=True)

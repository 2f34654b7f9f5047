"""Offline stand-ins built from the package registry (stacx.sandbox.standins): uv's images.
`COPY --from=ghcr.io/astral-sh/uv:0.9.7` and `FROM ghcr.io/astral-sh/uv:0.9.7-python3.12-...`
build through `stacx tasks check` on real Docker with the uv 0.9.7 binaries of PyPI's wheel;
the variant's base mapping (python:3.12-slim-bookworm on Ubuntu noble) is warned on the episode."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from stacx.launch.presets import check_tasks
from stacx.sandbox.aliases import AliasMap
from stacx.sandbox.standins import standin, standin_base

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

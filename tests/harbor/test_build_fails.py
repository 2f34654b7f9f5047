"""The fidelity warning explains the build it breaks: a python:3.10 task whose build needs 3.10
(standing for wheels pinned for 3.10) fails its build on the 3.11 base, and its episode records
the warning (episode_warned) and carries it in the image_build failure's message."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from stacx.launch.presets import check_tasks
from stacx.store.db import connect_run

from .conftest import FIXTURES

pytestmark = pytest.mark.docker


def test_a_failed_build_records_the_fidelity_warning(tmp_path: Path, base_images: object) -> None:
    run_dir, found = asyncio.run(
        check_tasks(FIXTURES / "build-fails", "oracle", run_dir=tmp_path / "run")
    )
    assert [(r.task_id, r.failure) for r in found] == [("py310-pinned", "image_build")]
    con = connect_run(run_dir)
    try:
        warned = con.execute("select task_id, message from episode_warned").fetchall()
        (failed,) = con.execute("select message from infra_failed").fetchone() or ("",)
    finally:
        con.close()
    why = (
        "python:3.10-slim asks for Python 3.10; it runs on stacx/base:bookworm with Python "
        "3.11 (wheels pinned for 3.10 may not exist for 3.11)"
    )
    assert warned == [("py310-pinned", why)]
    assert f"fidelity: {why}" in failed

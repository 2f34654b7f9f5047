"""The fidelity warning explains the build it breaks: a python:3.12 task whose build needs 3.12
(standing for wheels pinned for 3.12) fails its build on the 3.13 base, and its episode records
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
    run_dir, found = asyncio.run(check_tasks(FIXTURES / "build-fails", "oracle",
                                             run_dir=tmp_path / "run"))  # fmt: skip
    assert [(r.task_id, r.failure) for r in found] == [("py312-pinned", "image_build")]
    con = connect_run(run_dir)
    try:
        warned = con.execute("select task_id, message from episode_warned").fetchall()
        (failed,) = con.execute("select message from infra_failed").fetchone() or ("",)
    finally:
        con.close()
    why = ("python:3.12-slim asks for Python 3.12; it runs on stacx/base:trixie with Python 3.13 "
           "(wheels pinned for 3.12 may not exist for 3.13)")  # fmt: skip
    assert warned == [("py312-pinned", why)]
    assert f"fidelity: {why}" in failed

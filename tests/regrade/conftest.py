"""Fixtures of the regrade tests: the real base image, `stacx` as a subprocess (the front door),
and copies of bundled tasks to change."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stacx.sandbox.images import BASE_IMAGE, bootstrap_base_image
from stacx.store.db import connect_run

BASIC = Path(__file__).resolve().parents[2] / "recipes" / "tasks" / "basic"


@pytest.fixture(scope="session")
def base_image() -> Iterator[str]:
    """The offline base image; built here (minutes, once) if this engine lacks it."""
    bootstrap_base_image()
    yield BASE_IMAGE


def stacx(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """`python -m stacx ARGS`, from the repository root, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "stacx", *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        cwd=BASIC.parents[2],
    )


def rows(run_dir: Path, sql: str) -> list[tuple[object, ...]]:
    con = connect_run(run_dir)
    try:
        return con.sql(sql).fetchall()
    finally:
        con.close()


def copy_tasks(into: Path, *names: str) -> Path:
    """Copies of bundled tasks under `into` (a task set to change and hand to --tasks)."""
    for name in names:
        shutil.copytree(BASIC / name, into / name)
    return into

"""Fixtures of the Harbor conformance tests: the base images (built once if missing) and a
helper running the real `stacx` command line."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stacx.sandbox.images import BASE_IMAGE, TRIXIE_IMAGE, bootstrap_base_image
from tests.conftest import need_noble

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def base_images() -> Iterator[tuple[str, str]]:
    """stacx/base:bookworm and stacx/base:trixie (debootstrap, minutes, once per engine); the
    fixtures' ubuntu:24.04 and python:3.12 build stacx/base:noble on first use (skipped, saying
    why, where Ubuntu's archive does not answer: tests.conftest.need_noble)."""
    bootstrap_base_image()
    bootstrap_base_image(suite="trixie")
    need_noble()
    yield BASE_IMAGE, TRIXIE_IMAGE


def stacx(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m stacx ARGS` (the installed command line), capturing its output."""
    return subprocess.run(
        [sys.executable, "-m", "stacx", *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
    )

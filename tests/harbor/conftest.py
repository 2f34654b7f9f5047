"""Fixtures of the Harbor conformance tests: the base images (built once if missing) and a
helper running the real `stacx` command line."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stacx.sandbox.images import (
    BASE_IMAGE,
    NOBLE_IMAGE,
    TRIXIE_IMAGE,
    archive_answers,
    bootstrap_base_image,
    image_exists,
)

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def base_images() -> Iterator[tuple[str, str]]:
    """stacx/base:bookworm and stacx/base:trixie (debootstrap, minutes, once per engine), and
    stacx/base:noble, which the fixtures' ubuntu:24.04 and python:3.12 need: the tests skip,
    saying why, where Ubuntu's archive does not answer."""
    bootstrap_base_image()
    bootstrap_base_image(suite="trixie")
    if not image_exists(NOBLE_IMAGE) and (why := archive_answers("noble")) is not None:
        pytest.skip(f"stacx/base:noble cannot be built: {why}")
    bootstrap_base_image(suite="noble")
    yield BASE_IMAGE, TRIXIE_IMAGE


def stacx(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m stacx ARGS` (the installed command line), capturing its output."""
    return subprocess.run(
        [sys.executable, "-m", "stacx", *map(str, args)],
        capture_output=True, text=True, check=False, cwd=cwd,
    )  # fmt: skip

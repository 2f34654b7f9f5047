"""Fixtures of the sandbox tests: the real base image (built once if missing), real containers
(always removed), and small Harbor tasks written to tmp dirs."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiodocker
import pytest

from stacx.events import Event
from stacx.sandbox.docker import DockerSandbox, Limits
from stacx.sandbox.images import BASE_IMAGE, bootstrap_base_image

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def base_image() -> Iterator[str]:
    """The offline base image; built here (minutes, once) if this engine lacks it."""
    bootstrap_base_image()
    yield BASE_IMAGE


@pytest.fixture
async def docker() -> AsyncIterator[aiodocker.Docker]:
    async with aiodocker.Docker() as client:
        yield client


@pytest.fixture
async def sandbox(base_image: str, docker: aiodocker.Docker) -> AsyncIterator[DockerSandbox]:
    """A sandbox with tight limits: 1 cpu, 256 MB, 128 pids, no network."""
    limits = Limits(cpus=1, memory_mb=256, pids=128, allow_internet=False)
    sb = await DockerSandbox.create(base_image, limits, docker=docker, run_id="test")
    try:
        yield sb
    finally:
        await sb.close()


class Recorder:
    """An `Emit` that keeps what it is given (for tests of engines that emit)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    async def __call__(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type[Event]) -> list[Event]:
        return [e for e in self.events if isinstance(e, kind)]


@pytest.fixture
def emitted() -> Recorder:
    return Recorder()


def make_task(
    root: Path,
    name: str,
    *,
    test_sh: str,
    solve_sh: str | None = "true",
    dockerfile: str = "FROM debian:bookworm\nWORKDIR /app\n",
    toml: str = "",
    files: dict[str, str] | None = None,
) -> Path:
    """Write a Harbor task directory; `files` maps paths relative to the task to contents."""
    d = root / name
    for rel, text in {
        "instruction.md": f"Task {name}.\n",
        "task.toml": 'version = "1.0"\n' + textwrap.dedent(toml),
        "environment/Dockerfile": dockerfile,
        "tests/test.sh": "#!/bin/bash\n" + textwrap.dedent(test_sh),
        **({"solution/solve.sh": "#!/bin/bash\n" + textwrap.dedent(solve_sh)} if solve_sh else {}),
        **(files or {}),
    }.items():
        path = d / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return d


# The fixture tasks' own test files (tests/test_outputs.py) run inside containers, not here.
collect_ignore_glob = ["fixtures/*"]

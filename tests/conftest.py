"""Shared fixtures: a real nats-server on a free port, real DuckDB files in tmp dirs."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import torch

from stacx.bus.server import EmbeddedNats

# Task fixtures carry their own tests/ (a verifier's pytest files, run inside the task's image):
# never collected here
collect_ignore_glob = ["*/fixtures/*"]

# Without a GPU the CUDA decode kernels' tests (tests/inference/test_triton_kernels.py) run under
# Triton's CPU interpreter. Triton reads this once, when it is first imported, and other test
# modules' imports (transformers) may import it early: so it is set before any collection.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# tools/test.sh runs the suite in 3 pytest-xdist workers, one test file per worker at a time
# (--dist loadfile). These files hold the longest tests (minutes each on the 2-core machine):
# they go first, so that they overlap each other and the short files fill in around them, not
# after them. The fresh-host test is first of all: it untags stacx/base:noble and rebuilds it
# before any other test asks for it.
FIRST = [
    "tests/harbor/test_a_fresh_host.py",
    "tests/launch/test_crash.py",
    "tests/agents/test_installed.py",
    "tests/tasks/test_bundled_set.py",
    "tests/agents/test_scaffold_recipes.py",
    "tests/train/test_background_checkpoint.py",
    "tests/launch/test_ray.py",
    "tests/launch/test_recipes_e2e.py",
    "tests/harbor/test_compose_forms.py",
    "tests/train/test_rloo.py",
    "tests/harbor/test_eval_recipes.py",
    "tests/launch/test_processes.py",
    "tests/train/test_distributed_ray.py",
    "tests/inference/test_engine_agentic_bench.py",
    "tests/train/test_lora_run.py",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(FIRST)))


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(tmp_path / "nats-store") as server:
        yield server


@pytest.fixture(autouse=True)
def _no_external_nats(monkeypatch: pytest.MonkeyPatch) -> None:
    # tests start their own servers; a developer's STACX_NATS_URL must not leak in
    monkeypatch.delenv("STACX_NATS_URL", raising=False)


@pytest.fixture
async def run_ctx(tmp_path: Path) -> AsyncIterator[object]:
    from stacx.actors.run import RunContext

    async with RunContext(tmp_path / "run", recipe="test") as run:
        yield run


def need_noble() -> None:
    """Skip, saying why, when stacx/base:noble is not built and Ubuntu's archive (not a source
    this environment promises) does not answer; otherwise a task builds it on first use."""
    from stacx.sandbox.images import NOBLE_IMAGE, archive_answers, image_exists

    if not image_exists(NOBLE_IMAGE) and (why := archive_answers("noble")) is not None:
        pytest.skip(f"{NOBLE_IMAGE} cannot be built: {why}")


def stacx_bin() -> str:
    venv = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "stacx"
    return str(venv) if venv.exists() else "stacx"


os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Strict mode (stacx.actors.base): an actor that hits a programming error (TypeError,
# KeyError, AssertionError, ...) crashes the run with its traceback instead of being retried
# and restarted, so a bug cannot pass a test disguised as an infrastructure failure.
os.environ.setdefault("STACX_STRICT", "1")

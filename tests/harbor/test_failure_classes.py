"""Failure classes: an infrastructure failure that the configuration causes ends the task at
once (will_retry false, one clear message without terminal codes); an image build that fails
the same way twice stops at the second attempt; transient failures keep their retries. Real
Docker, through the launcher with three attempts per sample."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import msgspec
import pytest

from stacx.events import FailureKind
from stacx.launch.launcher import launch
from stacx.launch.presets import check_recipe
from stacx.ports import InfraFailure
from stacx.store.db import connect_run

from .conftest import FIXTURES

ESC = "\x1b"


def _failures(source: Path, run_dir: Path, **sandbox: object) -> list[tuple[object, ...]]:
    """(task, attempt, kind, will_retry, message) of every InfraFailed of a 3-attempt run."""
    recipe = check_recipe(source, "oracle")
    recipe = msgspec.structs.replace(
        recipe, sandbox=msgspec.structs.replace(recipe.sandbox, max_attempts=3, **sandbox)
    )
    outcome = asyncio.run(launch(recipe, run_dir, echo=lambda _m: None))
    con = connect_run(Path(outcome.run_dir))
    try:
        return con.execute(
            "select task_id, attempt, failure_kind, will_retry, message "
            "from infra_failed order by task_id, attempt"
        ).fetchall()
    finally:
        con.close()


@pytest.mark.docker
def test_a_missing_image_ends_at_once_and_a_repeated_install_failure_at_the_second(
    tmp_path: Path, base_images: object
) -> None:
    rows = _failures(FIXTURES / "failure-classes", tmp_path / "run")
    assert [r[:4] for r in rows] == [
        ("install-fails", 0, "image_build", True),
        ("install-fails", 1, "image_build", False),  # the same failure twice: deterministic
        ("no-alias", 0, "image_build", False),  # no alias, no base to build: at once
    ]
    assert "base image 'node:20-bookworm' cannot be pulled here and has no alias" in str(rows[2][4])
    assert "No matching distribution found for nosuchpkg" in str(rows[1][4])
    assert not any(ESC in str(r[4]) for r in rows), "terminal codes kept in a stored message"


@pytest.mark.docker
def test_an_unknown_runtime_ends_at_once_naming_the_ones_the_engine_has(
    tmp_path: Path, base_images: object
) -> None:
    runtimes = subprocess.run(
        ["docker", "info", "-f", "{{json .Runtimes}}"], capture_output=True, text=True, check=True
    ).stdout
    if "runsc" in runtimes:
        pytest.skip("this engine has gVisor's runsc: no unknown runtime to ask for")
    rows = _failures(FIXTURES / "failure-runtime", tmp_path / "run", runtime="runsc")
    assert [r[:4] for r in rows] == [("plain", 0, "start", False)]
    message = str(rows[0][4])
    assert "the Docker engine has no OCI runtime 'runsc'" in message and "runc" in message


def test_transient_failures_keep_their_retries_and_builds_compare_without_ids() -> None:
    assert InfraFailure(FailureKind.EXEC_TRANSPORT, "500 Server Error").retryable
    assert InfraFailure(FailureKind.START, "timeout talking to the daemon").signature() == ""
    first = InfraFailure(
        FailureKind.IMAGE_BUILD, f"{ESC}[31mbuild{ESC}[0m failed in 0123456789ab\nx"
    )
    again = InfraFailure(FailureKind.IMAGE_BUILD, "build failed in ba9876543210fe\ny")
    assert first.message.startswith("build failed") and first.signature() == again.signature()
    assert not InfraFailure(FailureKind.START, "x", final=True).retryable

"""Fixtures of the viewer tests: a real small run (a ReTool eval of the default model on two
math problems, process sandboxes, one short turn each), `stacx view` serving it as a user
starts it, and Debian's headless Chromium driven by Playwright."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("STACX_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The smallest real `stacx eval` that exercises a model: 2 tasks, 1 turn of 24 tokens."""
    out = tmp_path_factory.mktemp("view") / "run"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "stacx",
            "eval",
            "--agent",
            "retool",
            "--tasks",
            "math",
            "--limit",
            "2",
            "--max-turns",
            "1",
            "--max-new-tokens",
            "24",
            "--temperature",
            "0",
            "--run-dir",
            str(out),
        ],
        check=True,
        cwd=ROOT,
        env=env(),
        stdout=subprocess.DEVNULL,
        timeout=900,
    )
    return out


SQL_TIMEOUT_S = 2  # the viewer fixture's --sql-timeout


def start_viewer(*run_dirs: Path, args: tuple[str, ...] = ()) -> tuple[subprocess.Popen[str], str]:
    """`stacx view RUN... [ARGS]` as a user starts it; returns the process and the URL it printed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "stacx", "view", *map(str, run_dirs), *args],
        cwd=ROOT,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        found = re.search(r"http://127\.0\.0\.1:\d+/", line)
        if found:
            return proc, found.group(0).rstrip("/")
    proc.wait()
    raise AssertionError(f"stacx view exited ({proc.returncode}) without printing its URL")


@pytest.fixture(scope="session")
def viewer(run_dir: Path) -> Iterator[str]:
    proc, url = start_viewer(run_dir, args=("--sql-timeout", str(SQL_TIMEOUT_S)))
    yield url
    proc.terminate()
    proc.wait(timeout=30)


# module scope: Playwright's sync API runs an event loop of its own while the browser is open,
# and pytest-asyncio cannot run the async tests of other modules until it is closed
@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"no Chromium at {CHROMIUM}: tools/setup.sh installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield context
        context.close()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def page(browser: object) -> Iterator[object]:
    p = browser.new_page()  # type: ignore[attr-defined]
    errors: list[str] = []
    p.on("pageerror", lambda exc: errors.append(str(exc)))
    p.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    yield p
    p.close()
    assert not errors, f"the page logged errors: {errors}"

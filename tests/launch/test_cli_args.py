"""Bad arguments are refused before any work starts, in one line, without a traceback: ports
out of range or in use (`stacx serve`, `stacx view`: before the model loads), paths that do
not exist; and `--help` describes every option and argument."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def stacx(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stacx", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    [line] = [
        x for x in done.stderr.splitlines() if x.lower().startswith(("error", "stacx: error"))
    ]
    return line


@pytest.mark.parametrize("port", ["-5", "70000"])
def test_serve_refuses_a_port_out_of_range(port: str) -> None:
    assert "not in the range 0<=x<=65535" in one_line_error(stacx("serve", "--port", port))


def test_serve_refuses_a_port_in_use_before_loading_the_model(busy_port: int) -> None:
    line = one_line_error(stacx("serve", "--port", str(busy_port), "--model", "/no/such/model"))
    assert f"cannot listen on 127.0.0.1:{busy_port}" in line  # not the model's error: checked first


def test_view_refuses_bad_ports_and_paths(tmp_path: Path, busy_port: int) -> None:
    from stacx.store import db

    db.open_writer(tmp_path / "run").close()  # an (empty) run
    assert "99999 is not in the range" in one_line_error(
        stacx("view", str(tmp_path / "run"), "--port", "99999")
    )
    line = one_line_error(stacx("view", str(tmp_path / "run"), "--port", str(busy_port)))
    assert f"cannot listen on 127.0.0.1:{busy_port}" in line
    assert "does not exist" in one_line_error(stacx("view", str(tmp_path / "nope")))
    assert "--sql-timeout" in one_line_error(
        stacx("view", str(tmp_path / "run"), "--sql-timeout", "0")
    )


def test_help_describes_every_option() -> None:
    top = stacx("--help").stdout
    assert "Anthropic" in " ".join(top.split())  # serve's line in the command list
    assert "Anthropic Messages API" in " ".join(stacx("serve", "--help").stdout.split())
    assert "Usage: python -m stacx sql [OPTIONS] RUN_DIR... QUERY" in stacx("sql", "--help").stdout
    described = {
        "eval": {
            "--max-turns": "Model turns per episode",
            "--max-new-tokens": "Tokens the model may write",
            "--temperature": "Sampling temperature",
            "--seed": "Sampling seed",
        },
        "replay": {"--run-dir": "The new run's directory", "--set": "Override a recipe key"},
    }
    for command, options in described.items():
        text = " ".join(stacx(command, "--help").stdout.split())
        for option, words in options.items():
            assert f"{option} " in text and words in text.split(option, 1)[1][:120], (
                command,
                option,
            )

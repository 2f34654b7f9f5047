"""Every command that talks to NATS, started as an operator would against a closed port (a free
port with nothing listening): it ends with one message naming the URL, no nats client
tracebacks; `stacx sandbox serve` says once that it waits, retries quietly, serves once the
server comes up, and stops on SIGTERM and SIGINT while it waits.

The 60 s bounds are safety nets against the reported hang, not measures of speed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stacx.bus.server import EmbeddedNats, free_port

BOUND_S = 60.0
ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STACX_NATS")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def _stacx(*args: str) -> list[str]:
    return [sys.executable, "-m", "stacx", *args]


def _assert_one_clear_error(out: str, url: str) -> None:
    assert url in out, out
    assert "Traceback" not in out, out
    assert "nats: encountered error" not in out, out


@pytest.mark.parametrize(
    "args",
    [
        ["sandbox", "hosts"],
        ["sandbox", "ls"],
        ["sandbox", "stats"],
        ["sandbox", "stop", "abc"],
        ["sandbox", "gc", "--dry-run"],
    ],
    ids=lambda a: "-".join(a),
)
def test_admin_command_fails_naming_the_url(args: list[str]) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    proc = subprocess.run(
        _stacx(*args, "--url", url), capture_output=True, text=True, timeout=BOUND_S, env=_env()
    )
    assert proc.returncode == 2, proc.stderr
    _assert_one_clear_error(proc.stdout + proc.stderr, url)
    assert "cannot reach NATS" in proc.stderr


def test_url_from_the_environment_and_a_cluster_list() -> None:
    url = f"nats://127.0.0.1:{free_port()},nats://127.0.0.1:{free_port()}"
    proc = subprocess.run(
        _stacx("sandbox", "hosts"),
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        env=_env(STACX_NATS_URL=url),
    )
    assert proc.returncode == 2
    _assert_one_clear_error(proc.stderr, url)


def test_eval_on_the_remote_backend_fails_naming_the_url(tmp_path: Path) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    proc = subprocess.run(
        _stacx(
            "eval",
            "--agent",
            "oracle",
            "--limit",
            "1",
            "--set",
            "sandbox.backend=remote",
            "--set",
            f"sandbox.url={url}",
        ),
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        env=_env(),
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    _assert_one_clear_error(proc.stdout + proc.stderr, url)


def _serve(url: str, state: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        _stacx("sandbox", "serve", "--url", url, "--state-dir", str(state), "--slots", "1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
    )


def _read_until(proc: subprocess.Popen[str], needle: str) -> list[str]:
    """Lines of `proc` up to the one containing `needle` (the test fails if it exits first)."""
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"exited ({proc.wait()}) before {needle!r}: {''.join(lines)}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_waits_once_and_stops_on_a_signal(sig: signal.Signals, tmp_path: Path) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    proc = _serve(url, tmp_path / "state")
    try:
        lines = _read_until(proc, "waiting for it")
        assert url in lines[-1]
        time.sleep(3.0)  # a few quiet retries
        proc.send_signal(sig)
        rest, _ = proc.communicate(timeout=BOUND_S)
    finally:
        proc.kill()
    out = "".join(lines) + rest
    assert proc.returncode == 0, out
    assert out.count("waiting for it") == 1, out
    assert "Traceback" not in out, out


def test_serve_serves_once_the_server_comes_up(tmp_path: Path) -> None:
    port = free_port()
    proc = _serve(f"nats://127.0.0.1:{port}", tmp_path / "state")
    try:
        _read_until(proc, "waiting for it")
        with EmbeddedNats(tmp_path / "nats", port=port):
            _read_until(proc, "sandbox service")  # its ready line, once connected
            hosts = subprocess.run(
                _stacx("sandbox", "hosts", "--url", f"nats://127.0.0.1:{port}", "--format", "csv"),
                capture_output=True,
                text=True,
                timeout=BOUND_S,
                env=_env(),
            )
            assert hosts.returncode == 0, hosts.stderr
            assert len(hosts.stdout.strip().splitlines()) == 2, hosts.stdout  # header + this one
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=BOUND_S)
        assert proc.returncode == 0
    finally:
        proc.kill()

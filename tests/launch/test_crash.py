"""Crash test: kill -9 the launcher at random points, rerun the same command; the final counts
equal an uninterrupted run's and no event is recorded twice.

The launcher is a real `stacx run` process (embedded NATS, recorder, scheduler); the rollout
and trainer roles are the stand-ins of tests/launch/standins.py, slowed down so that kills land
while episodes are in flight. The quickstart-with-a-model variant is the same command on
recipes/quickstart.toml (see the module's `QUICKSTART` note in the report); this one runs in CI.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launch.test_launch import STANDIN, counts

ROOT = Path(__file__).resolve().parents[2]
ARGS = [
    "--set",
    "trainer.steps=3",
    "--set",
    "logging.progress='plain'",
    "--set",
    "logging.interval_s=0.5",
    "--set",
    "logging.plot=false",
    "--quiet",
]


def _cmd(run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "stacx", "run", str(STANDIN), "--run-dir", str(run_dir), *ARGS]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "STACX_STANDIN_DELAY": "0.25"}


def _complete(run_dir: Path) -> None:
    proc = subprocess.run(
        _cmd(run_dir), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def _kill_during_work(run_dir: Path, rng: random.Random) -> bool:
    """Start the command; once its progress shows scheduled work, SIGKILL it after a random
    0-3 s (so the kill lands mid-episode, mid-step or mid-commit whatever the machine's load);
    return whether it was still running then."""
    proc = subprocess.Popen(
        _cmd(run_dir),
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "groups=" in line and "groups=0 " not in line:
            break
    time.sleep(rng.uniform(0.0, 3.0))
    running = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    return running


# An uninterrupted run of this recipe: 3 iterations x 2 tasks x 2 samples scored, versions 1..3,
# 6 groups, no duplicate (test_launch.py checks the same formula on an uninterrupted run).
UNINTERRUPTED = (12, 3, 6, 0)


def test_kill_9_and_rerun_matches_uninterrupted(tmp_path: Path) -> None:
    expected = UNINTERRUPTED

    seed = int(os.environ.get("STACX_CRASH_SEED", time.time()))
    rng = random.Random(seed)
    crashed = tmp_path / "crashed"
    kills = 0
    for _ in range(2):
        kills += _kill_during_work(crashed, rng)
    _complete(crashed)
    got = counts(crashed)
    assert kills >= 1, f"seed {seed}: no kill landed"
    assert got[:4] == expected[:4], f"seed {seed}: {got} != {expected}"
    # one RunStarted per attempt that got as far as recording it
    assert got[4] >= 2


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_ctrl_c_or_sigterm_stops_cleanly_and_rerun_finishes(
    tmp_path: Path, sig: signal.Signals
) -> None:
    run_dir = tmp_path / "r"
    proc = subprocess.Popen(
        _cmd(run_dir),
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:  # wait until episodes are in flight
        if "in_flight=" in line and "in_flight=0" not in line:
            break
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-2000:]
    assert "Resume with the same command" in out
    from stacx.store import db

    meta = db.read_run_file(run_dir)
    assert meta["status"] == "interrupted" and meta["pid"] is None
    con = db.connect_run(run_dir)
    (status,) = con.execute(
        "select status from run_finished order by _seq desc limit 1"
    ).fetchone() or ("",)
    con.close()
    assert status == "interrupted"
    # the embedded NATS server went down with the run (no orphan server on its store)
    ps = subprocess.run(["pgrep", "-f", f"nats-server.*{run_dir}"], capture_output=True, text=True)
    assert ps.stdout.strip() == ""
    _complete(run_dir)
    assert counts(run_dir)[:4] == UNINTERRUPTED

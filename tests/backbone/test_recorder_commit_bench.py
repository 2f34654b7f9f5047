"""tools/bench/recorder_commit.py runs the recorder's own commit on a real DuckDB file and prints
its JSON line: small commits cost more per event than the same events in one commit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_commit_bench_prints_its_figures() -> None:
    r = subprocess.run(
        [sys.executable, "tools/bench/recorder_commit.py", "--events", "600", "--batches", "50"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["events"] == 600 and out["statement_floor_ms"] > 0
    assert out["b50"]["over_one_commit"] > 1  # twelve transactions cost more than one

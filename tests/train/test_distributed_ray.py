"""The N-rank trainer under Ray placement, on CPU: `stacx run` of the tiny ReTool GRPO recipe
(process sandbox, no Docker) with ``placement.mode = 'ray'`` and ``trainer.world_size = 2``. The
trainer role's Ray actor is rank 0 and spawns rank 1 (gloo) on its node; the step is recorded
with world size 2, the rollout worker (another Ray actor) then generates with the new version,
loaded through the node's shared memory rather than the checkpoint file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stacx.store import db

pytest.importorskip("ray")
pytestmark = [pytest.mark.model, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SETS = [
    "trainer.steps=1",
    "eval={}",  # the recipe's held-out eval has its own test (test_periodic_eval.py)
    "trainer.world_size=2",
    # the final norm only: a two-rank step (FSDP2 over gloo) whose backward stops at the norm
    r"trainer.trainable='^model\.norm\.weight$'",
    "tasks.per_iteration=1",
    "tasks.group_size=2",
    "agent.max_turns=1",
    "agent.max_new_tokens=8",
    "placement.mode='ray'",
    "placement.ray_num_cpus=2",
    "placement.rollout.cpus=0.5",
    "placement.trainer.cpus=0.5",
    "logging.plot=false",
    "logging.progress='off'",
]


def test_two_rank_trainer_in_a_ray_actor(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    cmd = [sys.executable, "-m", "stacx", "run", str(ROOT / "recipes/retool/grpo_tiny.toml")]
    cmd += ["--run-dir", str(run_dir), "--quiet", *(a for s in SETS for a in ("--set", s))]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    con = db.connect_run(run_dir)
    try:
        steps = con.execute("select step, world_size from train_steps").fetchall()
        loaded = con.execute("select version, transport from weights_loaded").fetchall()
    finally:
        con.close()
    assert steps == [(1, 2)]
    assert loaded == [(1, "shared")]

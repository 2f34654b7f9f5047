"""Training through each shipped scaffold: recipes/scaffold/grpo_<scaffold>.toml runs through
`stacx run` (the gateway records the scaffold's calls, the trainer steps on them) with its
periodic held-out eval, in a tiny form: one step, one group of two samples of one task."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stacx.sandbox.images import bootstrap_base_image
from stacx.store import db

pytestmark = [pytest.mark.docker, pytest.mark.model]

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "tasks.include=['create-hello-file']",
    "tasks.per_iteration=1",
    "trainer.batch_groups=1",
    "trainer.steps=1",
    "agent.max_turns=1",
    "agent.max_new_tokens=16",
    r"trainer.trainable='^model\.norm\.weight$'",
    "logging.progress='plain'",
    "logging.plot=false",
]


@pytest.mark.parametrize(
    "scaffold",
    [
        "mini-swe-agent",
        # terminus-2 and openhands-sdk are not trained through here (the suite's CPU budget: ~6
        # and ~12 worker-minutes); the gateway-to-trainer path is the same for every scaffold,
        # and their episodes through it are tests/agents/test_installed.py
    ],
)
def test_grpo_through_a_shipped_scaffold_with_held_out_eval(tmp_path: Path, scaffold: str) -> None:
    bootstrap_base_image()
    sets = TINY
    run_dir = tmp_path / "r"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stacx",
            "run",
            str(ROOT / f"recipes/scaffold/grpo_{scaffold}.toml"),
            "--run-dir",
            str(run_dir),
            "--quiet",
            *[a for s in sets for a in ("--set", s)],
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    con = db.connect_run(run_dir)
    # trained on the scaffold's recorded calls: one step over the training group's episodes
    ((n, ids),) = con.execute(
        "select n_samples, episode_ids from train_step_finished where step = 1"
    ).fetchall()
    train = con.execute("select episode_id, task_id from episodes where role = 'train'").fetchall()
    assert n >= 1 and sorted(ids) == sorted(e for e, _ in train)
    assert {t for _, t in train} == {"create-hello-file"}
    assert (
        con.execute(
            "select count(*) from turns t join episodes e using (episode_id) "
            "where e.role = 'train' and t.engine = 'gateway:torch' and t.n_output_tokens > 0"
        ).fetchone()[0]
        > 0
    )
    # the held-out task, evaluated at v0 and at the last version, never trained on
    evals = con.execute("select distinct task_id from episodes where role = 'eval'").fetchall()
    assert evals == [("create-empty-flag-file",)]
    curve = con.execute("select weight_version, n_samples from eval_curve order by 1").fetchall()
    assert curve == [(0, 1), (1, 1)]

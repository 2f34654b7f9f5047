"""`stacx run` of an eval recipe with `sandbox.backend = "process"` on image-less tasks (no
environment/Dockerfile), through the front door, with Docker unreachable: the oracle's
solutions run in process sandboxes and the verifier's rewards land in the run's log."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from stacx.store import db
from tests.sandbox.conftest import make_task

ROOT = Path(__file__).resolve().parents[2]

TEST_SH = """\
if [ "$(cat /app/answer.txt)" = 42 ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""


def image_less_task(root: Path, name: str, answer: str) -> Path:
    d = make_task(
        root,
        name,
        test_sh=TEST_SH,
        solve_sh=f"echo {answer} > /app/answer.txt\n",
        toml="[environment]\nmemory_mb = 512\n[verifier]\ntimeout_sec = 60\n",
    )
    (d / "environment" / "Dockerfile").unlink()
    (d / "environment").rmdir()
    return d


def test_eval_on_the_process_backend_scores_image_less_tasks(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    image_less_task(tasks, "right-answer", "42")
    image_less_task(tasks, "wrong-answer", "41")
    recipe = tmp_path / "eval.toml"
    recipe.write_text(
        f"""name = "eval-process"
[tasks]
path = "{tasks}"
group_size = 1
[agent]
name = "oracle"
max_turns = 3
[algorithm]
name = "eval"
[sandbox]
max_attempts = 1
[logging]
progress = "plain"
plot = false
"""
    )
    run_dir = tmp_path / "run"
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}  # Docker unused
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stacx",
            "run",
            str(recipe),
            "--run-dir",
            str(run_dir),
            "--quiet",
            "--set",
            "sandbox.backend='process'",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    con = db.connect_run(run_dir)
    rewards = dict(
        con.execute(
            "select s.task_id, r.reward from reward_assigned r join episodes s using (episode_id)"
        ).fetchall()
    )
    assert rewards == {"right-answer": 1.0, "wrong-answer": 0.0}
    assert con.execute("select count(*) from infra_failed").fetchone() == (0,)
    images = {r[0] for r in con.execute("select image from sandbox_started").fetchall()}
    assert images == {"process"}

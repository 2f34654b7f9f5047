"""``placement.mode = "processes"`` for real: the tiny ReTool GRPO recipe (the bundled model on
CPU, process sandboxes) with the engine, a rollout worker and the trainer each in a process of
its own, the launcher holding only NATS, the recorder and the scheduler.

Each role process is killed with SIGKILL once while the run is live (the engine mid-generation,
the rollout worker mid-episode, the trainer after a step); the placement starts each again and
the run must end as an uninterrupted one does: every version and step once, every group with
its scored samples, no event recorded twice. Every process publishes its load (event-loop lag,
CPU, forks), and the engine's process never forks.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stacx.store import db
from stacx.view.load import load_page
from stacx.view.source import Source
from tests.launch.run_shape import duplicates

pytestmark = [pytest.mark.model, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4
RECIPE = f"""
name = "processes-tiny"
[model]
path = "default"
[engine]
device = "cpu"
max_batch = 4
[sandbox]
backend = "process"
concurrency = 2
[tasks]
path = "math"
include = ["train-*"]
difficulty = ["trivial"]
per_iteration = 1
group_size = 2
[agent]
name = "retool"
format = "python"
max_turns = 1
max_new_tokens = 16
[algorithm]
name = "grpo"
mode = "sync"
[trainer]
trainable = '^model\\.norm\\.'
steps = {STEPS}
[placement]
mode = "processes"
[logging]
interval_s = 0.5
plot = false
tensorboard = false
"""


PROGRESS = re.compile(r"episodes scored=(?P<scored>\d+) .* step=(?P<step>\d+)?")


def _pid(run_dir: Path, role: str) -> int:
    return int((run_dir / "logs" / f"{role}.pid").read_text())


def _sql(run_dir: Path, sql: str) -> list[tuple[object, ...]]:
    con = db.connect_run(run_dir)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_each_role_process_killed_once_and_the_run_ends_as_uninterrupted(
    tmp_path: Path,
) -> None:
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "stacx", "run", str(recipe), "--run-dir", str(run_dir)]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "STACX_STRICT": "1"},
    )
    assert proc.stdout is not None
    # (what the progress line must show, the role to kill then): the engine mid-generation of
    # iteration 0, the rollout worker once a version is out, the trainer after its second step
    plan = [
        (lambda scored, step: scored >= 1, "engine-0"),
        (lambda scored, step: step >= 1, "rollout-0"),
        (lambda scored, step: step >= 2, "trainer-0"),
    ]
    out: list[str] = []
    killed: list[tuple[str, int]] = []
    for line in proc.stdout:
        out.append(line)
        m = PROGRESS.search(line)
        if plan and m and plan[0][0](int(m["scored"]), int(m["step"] or 0)):
            role = plan.pop(0)[1]
            pid = _pid(run_dir, role)
            os.kill(pid, signal.SIGKILL)
            killed.append((role, pid))
    rc = proc.wait(timeout=900)
    text = "".join(out)
    assert rc == 0, text[-5000:]
    assert [r for r, _ in killed] == ["engine-0", "rollout-0", "trainer-0"], text[-3000:]
    for role, pid in killed:
        assert f"role {role} was killed by signal 9; starting it again" in text
        assert _pid(run_dir, role) != pid  # a new process took its place
    assert _sql(run_dir, "select list(version order by version) from weights_published") == [
        (list(range(1, STEPS + 1)),)
    ]
    assert _sql(run_dir, "select list(step order by step) from train_step_finished") == [
        (list(range(1, STEPS + 1)),)
    ]
    # every training group ended with both of its samples scored, once each
    groups = _sql(
        run_dir,
        "select g.group_id, count(distinct e.sample_index) from task_scheduled g "
        "left join episodes e on e.group_id = g.group_id and e.status = 'scored' group by 1",
    )
    assert groups and all(k == 2 for _g, k in groups), groups
    assert duplicates(run_dir) == {}
    load = dict(_sql(run_dir, "select process, forks from process_load_run"))
    assert {"launcher", "engine-0", "rollout-0", "trainer-0"} <= set(load), load
    assert load["engine-0"] == 0, "the engine's process forked"
    assert load["rollout-0"] == 0, "a sandbox command was forked from the rollout process"
    assert db.read_run_file(run_dir)["status"] == "completed"
    # the viewer's time & load page lists every process beside the time accounting
    page = load_page(Source(run_dirs=[run_dir]), {})
    assert "where the time went" in page
    assert all(name in page for name in ("launcher", "engine-0", "rollout-0", "trainer-0"))


def test_processes_is_the_gpu_default_and_local_the_cpu_one() -> None:
    from stacx.launch.loader import convert
    from stacx.launch.plan import roles_for

    gpu = convert({"name": "x", "engine": {"device": "cuda"}, "trainer": {"device": "cuda"}})
    cpu = convert({"name": "x", "engine": {"device": "cpu"}, "trainer": {"device": "cpu"}})
    assert gpu.placement_mode == "processes" and cpu.placement_mode == "local"
    assert [r.name for r in roles_for(gpu)] == ["engine", "rollout", "trainer"]
    assert [r.name for r in roles_for(cpu)] == ["rollout", "trainer"]
    # a scripted agent has no engine to serve
    oracle = convert(
        {
            "name": "x",
            "agent": {"name": "oracle"},
            "algorithm": {"name": "eval"},
            "engine": {"device": "cuda"},
        }
    )
    assert [r.name for r in roles_for(oracle)] == ["rollout"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return (
        Path(f"/proc/{pid}").is_dir()
        and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]
    )


def test_a_killed_launcher_leaves_no_role_process_and_the_rerun_completes(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE.replace(f"steps = {STEPS}", "steps = 1"))
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "stacx", "run", str(recipe), "--run-dir", str(run_dir)]
    env = {**os.environ, "STACX_STRICT": "1"}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "episodes scored=1 " in line:
            break
    pids = [int(p.read_text()) for p in (run_dir / "logs").glob("*.pid")]
    assert len(pids) == 3, pids  # engine, rollout, trainer
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 90
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [p for p in pids if _alive(p)], "role processes outlived their kill -9'd launcher"
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "resumed" in done.stdout
    assert _sql(run_dir, "select list(version) from weights_published") == [([1],)]
    assert duplicates(run_dir) == {}

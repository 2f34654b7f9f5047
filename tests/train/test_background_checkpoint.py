"""Checkpoints off the trainer's path, through `stacx run` (the bundled model on CPU, the process
sandbox, the real engine, trainer and weight sync; real processes):

- ``trainer.checkpoint_every = N`` writes only every N-th version (and the last); the others
  reach the engine from memory and are published ``durable = false``;
- ``trainer.background_checkpoint``: the launcher is killed (SIGKILL) while a version's
  checkpoint is being written in the background; the rerun resumes from the newest durable
  version (a ``TrainerResumed`` event and a log line say so), never from the half-written one,
  redoes the later steps on their recorded episode ids, and ends with weights and optimizer
  state equal, bit for bit, to a trainer that replays the recorded steps without a crash.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pyarrow as pa
import pytest
import torch
from safetensors.torch import load_file

from stacx.store import db
from stacx.train import checkpoint
from stacx.train.batches import step_batch
from stacx.train.config import TrainerConfig
from stacx.train.model import build
from stacx.train.step import train_step

pytestmark = [pytest.mark.model, pytest.mark.slow]

# one intra-op thread in the runs and in the replay: float sums then reduce in one order
ENV = {**os.environ, "STACX_TORCH_THREADS": "1"}

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "retool" / "grpo_tiny.toml"
SMALL = [
    "--set", "eval={}",
    "--set", "tasks.per_iteration=1",
    "--set", "tasks.group_size=2",
    "--set", "agent.max_turns=1",
    "--set", "agent.max_new_tokens=8",
    "--set", "trainer.keep_last=0",
    "--set", "logging.plot=false",
    "--set", "logging.tensorboard=false",
    "--quiet",
]  # fmt: skip


def _cmd(run_dir: Path, *sets: str) -> list[str]:
    args = [a for s in sets for a in ("--set", s)]
    return [
        sys.executable,
        "-m",
        "stacx",
        "run",
        str(RECIPE),
        "--run-dir",
        str(run_dir),
        *SMALL,
        *args,
    ]


def _rows(run_dir: Path, sql: str) -> list[tuple[object, ...]]:
    con = db.connect_run(run_dir)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_checkpoint_every_writes_only_every_nth_version(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cmd = _cmd(run_dir, "trainer.steps=4", "trainer.checkpoint_every=2")
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert checkpoint.versions(run_dir) == [2, 4]
    published = _rows(
        run_dir, "select version, durable, sha256 = '' from weights_published order by version"
    )
    assert published == [(1, False, True), (2, True, False), (3, False, True), (4, True, False)]
    assert _rows(run_dir, "select version from checkpoint_saved order by 1") == [(2,), (4,)]
    # every version reached the engine (1 and 3 from memory only)
    loaded = _rows(run_dir, "select version, transport from weights_loaded order by 1")
    assert loaded == [(v, "memory") for v in (1, 2, 3, 4)]


def test_a_lora_version_is_written_before_it_is_published(tmp_path: Path) -> None:
    """With [trainer.lora], background_checkpoint and checkpoint_every do not leave a version
    off the disk: an engine merges an adapter with its directory's adapter_config.json."""
    run_dir = tmp_path / "run"
    cmd = _cmd(
        run_dir,
        "trainer.steps=2",
        "trainer.checkpoint_every=2",
        "trainer.background_checkpoint=true",
        "trainer.lora.rank=4",
    )
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert checkpoint.versions(run_dir) == [1, 2]
    published = _rows(
        run_dir, "select version, durable, bytes > 0 from weights_published order by version"
    )
    assert published == [(1, True, True), (2, True, True)]
    loaded = _rows(run_dir, "select version, adapter from weights_loaded order by 1")
    assert loaded == [(1, True), (2, True)]


def _kill_mid_write(cmd: list[str], run_dir: Path, last: int) -> int:
    """Start ``cmd``; SIGKILL it as soon as a background write (a staging directory of a
    version before ``last``) is on disk. Returns the killed version."""
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    root = checkpoint.checkpoint_root(run_dir)
    try:
        while proc.poll() is None:
            staged = [d.name for d in root.glob(".v*-*")] if root.is_dir() else []
            versions = [int(n[2:].split("-")[0]) for n in staged]
            if any(v < last for v in versions):
                proc.kill()
                proc.wait()
                return min(versions)
            time.sleep(0.005)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    pytest.fail(f"the run ended (rc {proc.returncode}) before a background write was seen")


def _replay(run_dir: Path, steps: int) -> tuple[dict[str, torch.Tensor], dict[str, object]]:
    """The recorded steps replayed by a trainer that never crashed: base model, then every
    step's batch (its recorded episode ids, read from the final log) in order."""
    con = db.connect_run(run_dir)
    try:
        (config_json,) = con.execute("select config_json from run_started limit 1").fetchone()  # type: ignore[misc]
        cfg = msgspec.convert(json.loads(config_json)["trainer"], TrainerConfig)
        batches = dict(
            con.execute(
                "select weight_version, arg_min(episode_ids, ts) from train_step_finished group by 1"
            ).fetchall()
        )

        async def query(sql: str, params: dict[str, object]) -> pa.Table:
            return con.sql(sql, params=params).to_arrow_table()

        torch.set_num_threads(1)
        model, optimizer = build(cfg, None)
        for step in range(1, steps + 1):
            batch = asyncio.run(step_batch(cfg, query, list(batches[step]), version=step - 1))
            train_step(cfg, model, optimizer, batch.samples, step)
    finally:
        con.close()
    return {n: p.detach() for n, p in model.named_parameters()}, optimizer.state_dict()


def test_kill_mid_background_write_resumes_from_the_last_durable_version(tmp_path: Path) -> None:
    run_dir, steps = tmp_path / "run", 2
    # the whole model trains: its checkpoint (weights + AdamW state, fsync'ed) takes seconds
    cmd = _cmd(
        run_dir,
        f"trainer.steps={steps}",
        "trainer.background_checkpoint=true",
        "trainer.trainable=''",
    )
    killed = _kill_mid_write(cmd, run_dir, steps)
    proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    output = proc.stdout + proc.stderr

    (resumed,) = _rows(run_dir, "select version, durable_version, redo_steps from trainer_resumed")
    version, durable, redo = resumed
    assert durable < killed <= version  # the half-written version was not picked up
    assert list(redo)[: version - durable] == list(range(durable + 1, version + 1))  # type: ignore[arg-type, operator]
    assert f"resuming from durable checkpoint v{durable}" in output
    assert not list(checkpoint.checkpoint_root(run_dir).glob(".v*"))  # no staging dir left
    assert _rows(
        run_dir, "select count(*), count(distinct weight_version) from train_step_finished"
    ) == [(steps, steps)]

    weights, opt_state = _replay(run_dir, steps)
    final = checkpoint.version_dir(run_dir, steps)
    saved = load_file(str(final / checkpoint.WEIGHTS_FILE))
    assert set(weights) <= set(saved)
    for name, tensor in weights.items():
        assert torch.equal(saved[name], tensor), name
    saved_opt = torch.load(final / checkpoint.OPTIMIZER_FILE, weights_only=True)
    for index, state in opt_state["state"].items():  # type: ignore[union-attr]
        for key, value in state.items():
            assert torch.equal(saved_opt["state"][index][key], value), (index, key)


def test_a_half_written_checkpoint_is_never_a_version(tmp_path: Path) -> None:
    root = checkpoint.checkpoint_root(tmp_path)
    (root / ".v3-abc").mkdir(parents=True)
    (root / ".v3-abc" / checkpoint.WEIGHTS_FILE).write_bytes(b"partial")
    assert checkpoint.versions(tmp_path) == []
    assert checkpoint.clear_staging(tmp_path) == [".v3-abc"]
    assert not (root / ".v3-abc").exists()

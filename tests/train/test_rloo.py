"""RLOO, the algorithm added as one module (stacx.train.algorithms.rloo) plus its recipe: its
batch's advantage is the leave-one-out one on a real log, and its tiny recipe trains through
`stacx run`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stacx.store import db
from stacx.train import units
from stacx.train.batches import scalar_rows, step_batch
from stacx.train.config import TrainerConfig
from tests.train.test_episode_packing import query_of
from tests.train.test_views import episode

from .conftest import Log

ROOT = Path(__file__).resolve().parents[2]


def leave_one_out(rewards: list[float]) -> list[float]:
    """The oracle: each reward minus the mean of the others of its group."""
    n = len(rewards)
    return [r - (sum(rewards) - r) / (n - 1) for r in rewards]


async def test_rloo_batch_advantage_is_the_leave_one_out_baseline(log: Log) -> None:
    rewards = {"a": 1.0, "b": 0.0, "c": 0.0, "d": 0.5}
    for eid, reward in rewards.items():
        episode(log, eid, "g", reward, turns=2)
    episode(log, "solo", "h", 1.0)  # a group of one: advantage 0
    cfg = TrainerConfig(algorithm="rloo", pack_episodes=False)
    ready = units.ready_units_sql(cfg)
    got = scalar_rows(log.con.sql(ready, params=units.params(cfg, ready, 0)).to_arrow_table())
    assert sorted(r["unit_id"] for r in got) == ["g", "h"]  # the unit is the group, as GRPO's
    batch = await step_batch(cfg, query_of(log), [*rewards, "solo"], version=0)
    episodes = batch.table.column("episode_id").to_pylist()
    assert episodes == ["a", "a", "b", "b", "c", "c", "d", "d", "solo"]
    want = dict(zip(rewards, leave_one_out(list(rewards.values())), strict=True)) | {"solo": 0.0}
    for eid, sample in zip(episodes, batch.samples, strict=True):
        adv = sample.token_values["advantages"]
        assert len(adv) == len(sample.completion_ids)
        np.testing.assert_allclose(adv, want[eid], rtol=1e-6)
    # not GRPO's: GRPO divides the centred reward by the group's std and does not rescale
    grpo = await step_batch(
        TrainerConfig(algorithm="grpo", pack_episodes=False),
        query_of(log),
        list(rewards),
        version=0,
    )
    assert not np.allclose(grpo.samples[0].token_values["advantages"], want["a"])


@pytest.mark.model
@pytest.mark.slow
def test_rloo_tiny_recipe_trains_through_stacx_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    sets = [
        "eval={}",
        "tasks.per_iteration=1",
        "tasks.group_size=4",
        "agent.max_turns=1",
        "agent.max_new_tokens=16",
        "trainer.steps=1",
        "logging.plot=false",
        "logging.tensorboard=false",
    ]
    cmd = [
        sys.executable,
        "-m",
        "stacx",
        "run",
        str(ROOT / "recipes/retool/rloo_tiny.toml"),
        "--run-dir",
        str(run_dir),
        "--quiet",
        *(a for s in sets for a in ("--set", s)),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    con = db.connect_run(run_dir)
    try:
        (ids,) = con.execute(
            "select episode_ids from train_step_finished where step = 1"
        ).fetchone()
        published = con.execute("select max(version) from weights_published").fetchone()
        rewards = dict(con.execute("select episode_id, reward from episodes").fetchall())
        rows = con.sql(
            "select episode_id, output_ids, behavior_logprobs, advantage, group_size "
            "from grpo_batch where list_contains($ids, episode_id)",
            params={"ids": ids},
        ).to_arrow_table()
    finally:
        con.close()
    assert published == (1,) and len(ids) == 4  # the group of 4 trained one step
    from stacx.train.algorithms import get

    samples = get("rloo").samples(TrainerConfig(algorithm="rloo"), rows, prompt=None)
    want = dict(zip(ids, leave_one_out([rewards[e] for e in ids]), strict=True))
    for eid, sample in zip(rows.column("episode_id").to_pylist(), samples, strict=True):
        np.testing.assert_allclose(sample.token_values["advantages"], want[eid], atol=1e-6)

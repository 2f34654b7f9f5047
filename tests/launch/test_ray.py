"""Ray placement: the same roles, each in a Ray actor on a small local cluster; NATS stays the
data plane and SQL goes through the launcher's query service."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stacx.launch.launcher import launch
from stacx.launch.loader import load_recipe
from stacx.store import db
from tests.launch.test_launch import QUIET, STANDIN, counts

ray = pytest.importorskip("ray")


async def test_standin_run_on_local_ray_cluster(tmp_path: Path) -> None:
    recipe = load_recipe(
        STANDIN,
        [
            *QUIET,
            "trainer.steps=2",
            "placement.mode='ray'",
            "placement.ray_num_cpus=2",
            "placement.rollout.cpus=0.5",
            "placement.trainer.cpus=0.5",
            "placement.rollout_workers=2",
        ],
    )
    out = await launch(recipe, tmp_path / "r", echo=lambda s: None, poll_s=0.3)
    assert out.verdict == "completed"
    assert counts(tmp_path / "r")[:4] == (8, 2, 4, 0)
    con = db.connect_run(tmp_path / "r")
    engines = {r[0] for r in con.execute("select distinct engine from turn_generated").fetchall()}
    con.close()
    # the stand-in rollout stamps its process id: the turns came from Ray worker processes
    pids = {int(e.removeprefix("pid")) for e in engines}
    assert pids and os.getpid() not in pids
    assert not ray.is_initialized()  # the launcher shut down the cluster it started

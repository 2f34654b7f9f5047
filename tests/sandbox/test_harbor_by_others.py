"""A Harbor task written by someone else (tests/sandbox/fixtures/others-csv-report): FROM
ubuntu:24.04 with apt-get and pip in RUN, COPY of a data dir, reward.json only,
allow_internet=false, tight memory_mb, an unknown task.toml key. Built through the alias map
(apt and pip reach their mirrors through the host's network and CA trust at build time),
then run as Harbor would: oracle scores 1.0, the null agent 0.0, with no network at run time."""

from __future__ import annotations

import json
from pathlib import Path

import aiodocker
import pytest

from stacx.harbor.tasks import load_task
from stacx.launch.presets import check_tasks
from stacx.sandbox.aliases import AliasMap
from stacx.sandbox.build import build_task_image
from stacx.sandbox.limits import task_limits
from stacx.sandbox.pool import SandboxPool
from stacx.store.db import connect_run
from tests.conftest import need_noble

from .conftest import FIXTURES, Recorder

pytestmark = pytest.mark.docker


async def test_third_party_task_oracle_and_null(
    base_image: str, docker: aiodocker.Docker, emitted: Recorder, tmp_path: Path
) -> None:
    need_noble()  # FROM ubuntu:24.04
    task = load_task(FIXTURES / "others-csv-report")
    image = await build_task_image(task, docker, AliasMap())
    limits = task_limits(task)
    assert (limits.allow_internet, limits.memory_mb) == (False, 256)
    async with SandboxPool(size=0, run_id="others", emit=emitted, docker=docker) as pool:
        async with pool.sandbox(image, limits) as sb:
            r = await sb.exec("ls /sys/class/net; ls /app/data; python3 -m pytest --version")
            assert r.stdout.split()[:2] == ["lo", "sales.csv"] and r.exit_code == 0
    rows, metrics = [], []
    for agent in ("oracle", "null"):
        run_dir, got = await check_tasks(task.path, agent, run_dir=tmp_path / agent)
        rows += got
        con = connect_run(run_dir)
        try:
            metrics += [
                json.loads(m) for (m,) in con.sql("select metrics_json from episodes").fetchall()
            ]
        finally:
            con.close()
    assert [(r.agent, r.ok, r.reward) for r in rows] == [("oracle", True, 1.0), ("null", True, 0.0)]
    assert metrics == [{"reward": 1.0, "n_checks": 2.0}, {"reward": 0.0, "n_checks": 2.0}]

"""A 3-server JetStream cluster on loopback (``STACX_NATS_URL`` lists all three; the run's
stream gets 3 replicas): the stream leader is killed -9 in the middle of a run through the front
door (`stacx run`, an oracle eval of 4 tasks x 2 samples) and brought back. The run completes,
and every event in the stream is in the log exactly once.

While the cluster elects a new leader (a few seconds) publishes get no responders or no ack:
the publisher retries them with the same message id (the server de-duplicates a try that did
land); the recorder's and actors' consumers error out, and their supervisors restart them from
their durable positions once a leader answers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stacx.bus.client import connect, ensure_stream
from stacx.bus.server import LocalCluster
from stacx.events import stream_name
from stacx.sandbox.images import bootstrap_base_image
from stacx.store import db
from stacx.wire import decode_many

pytestmark = [pytest.mark.docker]

ROOT = Path(__file__).resolve().parents[2]
TASKS = ["create-hello-file", "append-done-line", "copy-notes-backup", "count-lines-in-file"]


async def _cluster_ready(url: str) -> None:
    """Wait until JetStream has a meta leader: an R3 stream can be created."""
    nc = await connect(url)
    js = nc.jetstream(timeout=2.0)
    deadline = time.monotonic() + 60
    while True:
        try:
            await ensure_stream(js, "probe", replicas=3)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.25)
    await js.delete_stream(stream_name("probe"))
    await nc.drain()


async def _stream_state(url: str, name: str) -> tuple[int, str | None, int]:
    """(messages, leader, replicas) of a stream; (0, None, 0) while it does not exist."""
    nc = await connect(url)
    try:
        info = await nc.jetstream(timeout=2.0).stream_info(name)
    except Exception:
        return 0, None, 0
    finally:
        await nc.close()
    leader = info.cluster.leader if info.cluster else None
    return info.state.messages, leader, info.config.num_replicas or 1


async def _stream_event_ids(url: str, name: str) -> list[str]:
    nc = await connect(url)
    js = nc.jetstream(timeout=5.0)
    last = (await js.stream_info(name)).state.last_seq
    ids = [
        e.event_id
        for seq in range(1, last + 1)
        for e in decode_many((await js.get_msg(name, seq)).data)
    ]
    await nc.drain()
    return ids


async def test_a_run_survives_the_loss_of_its_stream_leader(tmp_path: Path) -> None:
    bootstrap_base_image()
    run_dir = tmp_path / "run"
    with LocalCluster(tmp_path / "cluster") as cluster:
        await _cluster_ready(cluster.url)
        args = [
            "--set",
            f"tasks.include={TASKS!r}",
            "--set",
            "tasks.group_size=2",
            "--set",
            "logging.plot=false",
            "--set",
            "logging.progress='plain'",
        ]
        proc = subprocess.Popen(  # noqa: ASYNC220
            [
                sys.executable,
                "-m",
                "stacx",
                "run",
                str(ROOT / "recipes/eval/oracle.toml"),
                "--run-dir",
                str(run_dir),
                "--quiet",
                *args,
            ],
            cwd=ROOT,
            env={**os.environ, "STACX_NATS_URL": cluster.url},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        while not (run_dir / "run.json").exists() or "run_id" not in json.loads(
            (run_dir / "run.json").read_text()
        ):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            await asyncio.sleep(0.05)
        stream = stream_name(json.loads((run_dir / "run.json").read_text())["run_id"])
        while True:  # in the middle: the run has published its first events
            messages, leader, replicas = await _stream_state(cluster.url, stream)
            if messages >= 3 and leader:
                break
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            await asyncio.sleep(0.05)
        assert replicas == 3
        victim = cluster.server_named(leader)
        assert proc.poll() is None  # the run is still going when its stream leader dies
        cluster.kill(victim)
        await asyncio.sleep(3)
        cluster.restart(victim)
        _out, err = await asyncio.to_thread(proc.communicate, timeout=300)
        assert proc.returncode == 0, err[-4000:]
        in_stream = await _stream_event_ids(cluster.url, stream)
    con = db.connect_run(run_dir)
    logged = [r[0] for r in con.execute("select event_id from _events").fetchall()]
    scored = con.execute("select count(*) from episodes where reward = 1").fetchone()
    status = json.loads((run_dir / "run.json").read_text())["status"]
    con.close()
    assert status == "completed"
    assert len(logged) == len(set(logged)) and set(logged) == set(in_stream)
    assert scored == (len(TASKS) * 2,)

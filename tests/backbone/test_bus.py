"""Embedded NATS and the publisher, against real nats-server processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stacx.bus.client import Publisher, connect, ensure_stream
from stacx.bus.server import EmbeddedNats
from stacx.errors import PublishError
from stacx.events import RunFinished, RunStatus, stream_name
from stacx.wire import decode_many


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie is dead for our purpose
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_embedded_server_starts_with_jetstream_in_the_run_dir_and_stops(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "nats").start()
    assert server.proc is not None
    pid = server.proc.pid
    assert _alive(pid)
    server.stop()
    assert not _alive(pid)
    assert (tmp_path / "nats").is_dir()


def test_server_dies_with_its_parent(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys, time
        from stacx.bus.server import EmbeddedNats
        s = EmbeddedNats({str(tmp_path / "nats")!r}).start()
        print(s.proc.pid, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert _alive(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "nats-server outlived a kill -9 of its parent"


async def test_duplicate_publishes_are_deduplicated(nats_server: EmbeddedNats) -> None:
    nc = await connect(nats_server.url)
    js = nc.jetstream()
    await ensure_stream(js, "dup")
    pub = Publisher(js, "dup")
    e = RunFinished(run_id="dup", status=RunStatus.COMPLETED)
    s1 = await pub.publish(e)
    s2 = await pub.publish(e)  # same event_id
    assert s1 == s2 and pub.duplicates == 1
    info = await js.stream_info(stream_name("dup"))
    assert info.state.messages == 1
    await nc.drain()


async def test_pipelined_publishes_all_acknowledged(nats_server: EmbeddedNats) -> None:
    nc = await connect(nats_server.url)
    js = nc.jetstream()
    await ensure_stream(js, "pipe")
    pub = Publisher(js, "pipe", max_pending=64)
    for i in range(2000):
        await pub.submit(RunFinished(run_id="pipe", status=RunStatus.COMPLETED, message=str(i)))
    await pub.flush()
    info = await js.stream_info(stream_name("pipe"))
    got = []
    for seq in range(1, info.state.last_seq + 1):
        got += [e.message for e in decode_many((await js.get_msg(stream_name("pipe"), seq)).data)]
    assert got == [str(i) for i in range(2000)]  # every event once, in order
    assert pub.published == 2000 and info.state.messages == pub.messages < 2000  # batched
    await nc.drain()


async def test_concurrent_publishes_of_one_kind_share_a_message(nats_server: EmbeddedNats) -> None:
    nc = await connect(nats_server.url)
    js = nc.jetstream()
    await ensure_stream(js, "conc")
    pub = Publisher(js, "conc")
    events = [
        RunFinished(run_id="conc", status=RunStatus.COMPLETED, message=str(i)) for i in range(50)
    ]
    seqs = await asyncio.gather(*(pub.publish(e) for e in events))
    assert len(set(seqs)) == 1 and pub.messages == 1
    assert [
        e.event_id for e in decode_many((await js.get_msg(stream_name("conc"), seqs[0])).data)
    ] == [e.event_id for e in events]
    await nc.drain()


async def test_a_publish_is_retried_until_its_stream_answers(nats_server: EmbeddedNats) -> None:
    # what a publisher sees while a cluster elects a stream leader: no responders, then an ack
    nc = await connect(nats_server.url)
    js = nc.jetstream()
    pub = Publisher(js, "late")
    sending = asyncio.create_task(
        pub.publish(RunFinished(run_id="late", status=RunStatus.COMPLETED))
    )
    await asyncio.sleep(0.5)
    assert not sending.done()
    await ensure_stream(js, "late")
    assert await sending == 1 and pub.retries > 0
    await nc.drain()


async def test_unacknowledged_publish_is_an_error_the_caller_sees(
    nats_server: EmbeddedNats,
) -> None:
    nc = await connect(nats_server.url)
    js = nc.jetstream()
    pub = Publisher(js, "nostream", ack_timeout=1.0)  # no stream captures this subject
    with pytest.raises(PublishError, match="not acknowledged"):
        await pub.publish(RunFinished(run_id="nostream", status=RunStatus.COMPLETED, message="x"))
    await pub.submit(RunFinished(run_id="nostream", status=RunStatus.COMPLETED, message="y"))
    with pytest.raises(PublishError):
        await pub.flush()
    await nc.drain()


async def test_publish_after_server_death_raises(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "nats").start()
    nc = await connect(server.url)
    js = nc.jetstream()
    await ensure_stream(js, "gone")
    pub = Publisher(js, "gone", ack_timeout=1.0)
    await pub.publish(RunFinished(run_id="gone", status=RunStatus.COMPLETED, message="ok"))
    server.stop()
    with pytest.raises(PublishError):
        await pub.publish(RunFinished(run_id="gone", status=RunStatus.COMPLETED, message="lost?"))
    await nc.close()


async def test_external_url_is_used_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stacx.actors.run import RunContext

    with EmbeddedNats(tmp_path / "external") as external:
        monkeypatch.setenv("STACX_NATS_URL", external.url)
        async with RunContext(tmp_path / "run") as run:
            assert run.server is None and run.nats_url == external.url
            await run.emit(
                RunFinished(run_id=run.run_id, status=RunStatus.COMPLETED, message="probe")
            )
            rows = await run.query("select count(*) from run_finished")
            assert rows.column(0)[0].as_py() == 1
        nc = await connect(external.url)
        info = await nc.jetstream().stream_info(stream_name(run.run_id))
        assert info.state.messages >= 3  # RunStarted, probe, RunFinished on the external server
        await nc.drain()

"""Actor runtime: delivery by kind, ack after handle, redelivery on error, supervision, work
queues and per-instance consumers, strict mode, causal reads."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from stacx import events as ev
from stacx.actors.base import Actor
from stacx.actors.run import RunContext


class Counter(Actor):
    name = "counter"
    kinds = (ev.TaskScheduled,)
    max_inflight = 4

    def __init__(self, fail_first: int = 0) -> None:
        self.seen: list[str] = []
        self.fail_first = fail_first
        self.attempts = 0

    async def handle(self, event: ev.Event) -> None:
        assert isinstance(event, ev.TaskScheduled)
        self.attempts += 1
        if self.attempts <= self.fail_first:
            raise ConnectionError("transient")  # infrastructure: retried, even in strict mode
        await self.publish(
            ev.EpisodeStarted(
                run_id=self.run_id,
                episode_id=f"ep-{event.task_id}",
                task_id=event.task_id,
                group_id=event.group_id,
                event_id=ev.derive_id(self.run_id, event.task_id),
            )
        )
        self.seen.append(event.task_id)  # after its publish is acked: the stream holds it


async def _until(cond, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def _given_up(run: RunContext, timeout: float = 20.0) -> list[str]:
    """The messages of the internal InfraFailed events, once there is one: the actor publishes it
    after its last failed handle returns, so `calls == max_deliver` comes first."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        rows = await run.query(
            "select message from infra_failed where failure_kind = ?", ["internal"], barrier=True
        )
        if rows.num_rows or asyncio.get_running_loop().time() > deadline:
            return [m.as_py() for m in rows.column(0)]
        await asyncio.sleep(0.05)


def _task(run_id: str, i: int) -> ev.TaskScheduled:
    return ev.TaskScheduled(run_id=run_id, task_id=f"t{i}", task_path="/x", group_id=f"g{i}")


async def test_actor_gets_its_kinds_and_publishes(tmp_path: Path) -> None:
    async with RunContext(tmp_path / "run") as run:
        a = Counter()
        run.spawn(a)
        for i in range(5):
            await run.emit(_task(run.run_id, i))
        await run.emit(
            ev.RunFinished(
                run_id=run.run_id, status=ev.RunStatus.COMPLETED, message="not for the counter"
            )
        )
        await _until(lambda: len(a.seen) == 5)
        # the actor's publishes, not this context's: wait for the recorder to reach the head
        rows = await run.query("select count(*) from episode_started", barrier=True)
        assert rows.column(0)[0].as_py() == 5
    assert sorted(a.seen) == [f"t{i}" for i in range(5)]


class QuickRetry(Counter):
    retry_delay = 0.05


async def test_failed_handle_is_redelivered(tmp_path: Path) -> None:
    async with RunContext(tmp_path / "run") as run:
        a = QuickRetry(fail_first=2)
        run.spawn(a)
        await run.emit(_task(run.run_id, 0))
        await _until(lambda: a.seen == ["t0"])
        assert a.attempts == 3


class Crashy(Actor):
    name = "crashy"
    kinds = ()

    def __init__(self) -> None:
        self.starts = 0

    async def run(self, stop: asyncio.Event) -> None:
        self.starts += 1
        if self.starts < 3:
            raise ConnectionError("boom")
        await stop.wait()


async def test_supervisor_restarts_a_crashed_actor(tmp_path: Path) -> None:
    async with RunContext(tmp_path / "run") as run:
        a = Crashy()
        sup = run.spawn(a)
        await _until(lambda: a.starts == 3)
        assert sup.restarts == 2


class Worker(Counter):
    name = "workers"
    shared = True
    max_inflight = 1

    async def handle(self, event: ev.Event) -> None:
        await asyncio.sleep(0.1)  # 20 tasks keep one worker busy 2 s: both get some
        await super().handle(event)


async def test_shared_actors_split_a_work_queue_and_resume_after_restart(tmp_path: Path) -> None:
    async with RunContext(tmp_path / "run") as run:
        w1, w2 = Worker(), Worker()
        run.spawn(w1)
        run.spawn(w2)
        for i in range(20):
            await run.emit(_task(run.run_id, i))
        await _until(lambda: len(w1.seen) + len(w2.seen) == 20)
        assert w1.seen and w2.seen and not set(w1.seen) & set(w2.seen)
    # rerun on the same run dir: the durable consumer resumes after what was acknowledged
    async with RunContext(tmp_path / "run") as run:
        w3 = Worker()
        run.spawn(w3)
        await run.emit(_task(run.run_id, 99))
        await _until(lambda: w3.seen == ["t99"])
        await asyncio.sleep(0.3)
        assert w3.seen == ["t99"]


async def test_unshared_instances_each_get_every_event_and_resume(tmp_path: Path) -> None:
    async with RunContext(tmp_path / "run") as run:
        c1, c2 = Counter(), Counter()  # shared = False: one durable consumer each
        run.spawn(c1)
        run.spawn(c2)
        assert (c1.consumer, c2.consumer) == ("counter", "counter-1")
        for i in range(10):
            await run.emit(_task(run.run_id, i))
        await _until(lambda: len(c1.seen) == len(c2.seen) == 10)
        assert sorted(c1.seen) == sorted(c2.seen)
    async with RunContext(tmp_path / "run") as run:  # same spawn order, same consumers
        c3, c4 = Counter(), Counter()
        run.spawn(c3)
        run.spawn(c4)
        await run.emit(_task(run.run_id, 99))
        await _until(lambda: c3.seen == c4.seen == ["t99"])


class Buggy(Actor):
    name = "buggy"
    kinds = (ev.TaskScheduled,)

    def __init__(self) -> None:
        self.calls = 0
        self.starts = 0

    async def on_start(self) -> None:
        self.starts += 1

    async def handle(self, event: ev.Event) -> None:
        self.calls += 1
        raise TypeError("a bug, not bad luck")


async def test_strict_mode_crashes_on_a_programming_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STACX_STRICT", "1")
    a = Buggy()
    with pytest.raises(TypeError, match="a bug"):
        async with RunContext(tmp_path / "run") as run:
            run.spawn(a)
            await run.emit(_task(run.run_id, 0))
            await _until(lambda: bool(run.crashes))
    assert (a.calls, a.starts) == (1, 1)  # neither retried nor restarted
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["status"] == "failed"


async def test_without_strict_mode_a_programming_error_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STACX_STRICT", "0")

    class Patient(Buggy):
        retry_delay = 0.01
        max_deliver = 3

    a = Patient()
    async with RunContext(tmp_path / "run") as run:
        run.spawn(a)
        await run.emit(_task(run.run_id, 0))
        assert len(await _given_up(run)) == 1  # gave up after max_deliver: recorded as such
        assert a.calls == 3
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "completed"


class NotAnException(BaseException):
    """What some libraries raise (torch's CheckpointException derives from BaseException)."""


async def test_a_base_exception_from_a_handler_is_retried_then_given_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not an Exception, still a failure: retried like one, then an InfraFailed; it must not
    end the dispatch task unseen, its message unacked (the run would wait for it forever)."""
    monkeypatch.setenv("STACX_STRICT", "0")

    class Odd(Buggy):
        retry_delay = 0.01
        max_deliver = 3

        async def handle(self, event: ev.Event) -> None:
            self.calls += 1
            raise NotAnException("raised as less than an Exception")

    a = Odd()
    async with RunContext(tmp_path / "run") as run:
        run.spawn(a)
        task = _task(run.run_id, 0)
        await run.emit(task)
        assert await _given_up(run) == [
            f"actor buggy gave up on TaskScheduled {task.event_id}: "
            "NotAnException('raised as less than an Exception')"
        ]
        assert a.calls == 3


async def test_strict_mode_crashes_on_a_base_exception(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STACX_STRICT", "1")

    class Odd(Buggy):
        async def handle(self, event: ev.Event) -> None:
            self.calls += 1
            raise NotAnException("raised as less than an Exception")

    with pytest.raises(NotAnException):
        async with RunContext(tmp_path / "run") as run:
            run.spawn(Odd())
            await run.emit(_task(run.run_id, 0))
            await _until(lambda: bool(run.crashes))


class Reader(Actor):
    """Publishes one EpisodeStarted per task, then reads it back with its own query."""

    name = "reader"
    kinds = (ev.TaskScheduled,)

    def __init__(self) -> None:
        self.counts: list[int] = []

    async def handle(self, event: ev.Event) -> None:
        assert isinstance(event, ev.TaskScheduled)
        await self.publish(
            ev.EpisodeStarted(
                run_id=self.run_id,
                episode_id=f"ep-{event.task_id}",
                task_id=event.task_id,
                group_id=event.group_id,
            )
        )
        rows = await self.query(
            "select count(*) from episode_started where task_id = ?", [event.task_id]
        )
        self.counts.append(rows.column(0)[0].as_py())


async def test_a_query_waits_for_the_actors_own_writes_not_the_stream_head(tmp_path: Path) -> None:
    async with RunContext(tmp_path / "run") as run:
        r = Reader()
        run.spawn(r)
        for i in range(5):
            await run.emit(_task(run.run_id, i))
        await _until(lambda: len(r.counts) == 5)
        assert r.counts == [1] * 5  # read-your-writes
        assert r.ctx.watermark.seq >= 10  # 5 tasks delivered + 5 episodes published
        # a publish outside the actor does not raise its watermark: it would not wait for it
        before = r.ctx.watermark.seq
        await run.emit(
            ev.RunFinished(run_id=run.run_id, status=ev.RunStatus.COMPLETED, message="probe")
        )
        assert r.ctx.watermark.seq == before
        await r.query("select 1", barrier=True)  # the barrier raises it to the head
        assert r.ctx.watermark.seq == await run.last_seq()


async def test_run_json_says_completed_only_after_the_recorder_drained(tmp_path: Path) -> None:
    async with RunContext(tmp_path / "ok") as run:
        await run.emit(_task(run.run_id, 0))
    ok = json.loads((tmp_path / "ok" / "run.json").read_text())
    assert (ok["status"], ok["problems"]) == ("completed", [])
    async with RunContext(tmp_path / "run") as run:
        assert run.recorder is not None and run._recorder_sup is not None
        run.recorder.stop()  # the recorder is gone before the run ends: the log is incomplete
        await run._recorder_sup
        await run.emit(_task(run.run_id, 0))
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["status"] == "failed"
    assert any("recorder did not drain" in p for p in meta["problems"])

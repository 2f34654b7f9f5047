"""Actor runtime: delivery by kind, ack after handle, redelivery on error, supervision, work queues."""

from __future__ import annotations

import asyncio
from pathlib import Path

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
            raise RuntimeError("transient")
        self.seen.append(event.task_id)
        await self.publish(ev.EpisodeStarted(run_id=self.run_id, episode_id=f"ep-{event.task_id}",
                                             task_id=event.task_id, group_id=event.group_id,
                                             event_id=ev.derive_id(self.run_id, event.task_id)))


async def _until(cond, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def _task(run_id: str, i: int) -> ev.TaskScheduled:
    return ev.TaskScheduled(run_id=run_id, task_id=f"t{i}", task_path="/x", group_id=f"g{i}")


async def test_actor_gets_its_kinds_and_publishes(tmp_path: Path) -> None:
    async with RunContext(tmp_path / "run") as run:
        a = Counter()
        run.spawn(a)
        for i in range(5):
            await run.emit(_task(run.run_id, i))
        await run.emit(ev.RunFinished(run_id=run.run_id, status="not for the counter"))
        await _until(lambda: len(a.seen) == 5)
        rows = await run.query("select count(*) from episode_started")
        assert rows.column(0)[0].as_py() == 5
    assert sorted(a.seen) == [f"t{i}" for i in range(5)]


async def test_failed_handle_is_redelivered(tmp_path: Path) -> None:
    Counter.retry_delay = 0.05
    async with RunContext(tmp_path / "run") as run:
        a = Counter(fail_first=2)
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
            raise RuntimeError("boom")
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
        await asyncio.sleep(0.05)
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

"""The launcher's SQL service for actors in other processes: same answers as a local query,
results larger than one NATS message, errors carried back."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from stacx import events as ev
from stacx.actors.run import RunContext
from stacx.bus.client import connect
from stacx.store.query import QueryError, QueryService, remote_query


async def test_remote_query_sees_own_writes_and_big_results(tmp_path: Path) -> None:
    async with RunContext(tmp_path / "run") as run:
        assert run.nc is not None
        service = QueryService(run.nc, run.run_id, run.query)
        await service.start()
        nc = await connect(run.nats_url)  # a separate connection, as a Ray actor has
        try:
            query = remote_query(nc, run.run_id, timeout=30)
            for i in range(3):
                await run.emit(
                    ev.TaskScheduled(
                        run_id=run.run_id, task_id=f"t{i}", task_path="/x", group_id=f"g{i}"
                    )
                )
            got = await query("select task_id from task_scheduled order by task_id")
            assert got.column(0).to_pylist() == ["t0", "t1", "t2"]
            # ~3 MB: split over several messages (the default NATS limit is 1 MiB)
            big = await query("select repeat('x', 1000) || i::varchar as s from range(3000) t(i)")
            local = await run.query(
                "select repeat('x', 1000) || i::varchar as s from range(3000) t(i)"
            )
            assert big.equals(local) and big.num_rows == 3000
            with pytest.raises(QueryError, match="no_such_table"):
                await query("select * from no_such_table")
            assert service.served == 2
        finally:
            await nc.close()
            await service.stop()


async def test_a_long_query_does_not_hold_up_the_others(tmp_path: Path) -> None:
    # two actors ask at once; the first asks a query that runs until the test ends it: the
    # second is answered meanwhile (each request is served in a task of its own, on a cursor of
    # its own)
    async with RunContext(tmp_path / "run") as run:
        assert run.nc is not None and run.recorder is not None
        release = threading.Event()

        def held(n: int) -> int:
            release.wait(60)
            return n

        if run.recorder.con is None:
            run.recorder.open()
        assert run.recorder.con is not None
        run.recorder.con.create_function("held", held, [int], int)  # type: ignore[list-item]
        service = QueryService(run.nc, run.run_id, run.query)
        await service.start()
        nc = await connect(run.nats_url)
        try:
            query = remote_query(nc, run.run_id, timeout=30)
            slow = asyncio.create_task(query("select held(41) as n"))
            await asyncio.sleep(0.2)
            quick = await query("select 42 as n")  # before the slow one is let go
            assert quick.column(0).to_pylist() == [42] and not slow.done()
            release.set()
            assert (await slow).column(0).to_pylist() == [41]
        finally:
            release.set()
            await nc.close()
            await service.stop()

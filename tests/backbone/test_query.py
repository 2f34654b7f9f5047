"""The launcher's SQL service for actors in other processes: same answers as a local query,
results larger than one NATS message, errors carried back."""

from __future__ import annotations

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

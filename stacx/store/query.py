"""The log's read contract (``Query``: SQL with bound parameters) and SQL over the log from
another process: the launcher, where the recorder lives, serves ``stacxq.<run_id>`` over NATS.
A reply reflects every event up to the sender's ``after`` (its watermark: read-your-writes);
requests are served one at a time. Design: docs/concepts/placement.md#sql-from-another-process
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Mapping, Sequence
from typing import Protocol, TypeAlias

import msgspec
import nats.aio.client
import pyarrow as pa
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from stacx.errors import StacxError
from stacx.events import clipped

log = logging.getLogger(__name__)

Params: TypeAlias = Sequence[object] | Mapping[str, object] | None
"""DuckDB bound parameters: a sequence for ``?``/``$1`` placeholders, a mapping for ``$name``."""


class Query(Protocol):
    """SQL over the run's log (views included) with bound parameters, never values in the text:
    ``query("... WHERE episode_id = ?", [episode_id])``."""

    def __call__(self, sql: str, params: Params = None, /) -> Awaitable[pa.Table]: ...


class QueryAfter(Protocol):
    """A ``Query`` that first waits until sequence ``after`` is committed (None: default)."""

    def __call__(
        self, sql: str, params: Params = None, /, *, after: int | None = None
    ) -> Awaitable[pa.Table]: ...


CHUNK = 512 * 1024
TIMEOUT_S = 120.0


class QueryError(StacxError):
    """A remote query failed; the message is the launcher's error."""


class QueryRequest(msgspec.Struct, frozen=True, kw_only=True):
    sql: str
    params: list[object] | dict[str, object] | None = None
    after: int | None = None  # None: wait for the stream's head when served


class ServedQuery(Protocol):
    """What the service answers with: ``RunContext.query``."""

    def __call__(
        self, sql: str, params: Params = None, /, *, after: int | None = None, barrier: bool = False
    ) -> Awaitable[pa.Table]: ...


def query_subject(run_id: str) -> str:
    return f"stacxq.{run_id}"


def to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def from_ipc(data: bytes) -> pa.Table:
    with pa.ipc.open_stream(pa.py_buffer(data)) as reader:
        return reader.read_all()


class QueryService:
    """Serves ``query`` (the launcher's RunContext.query) to remote actors."""

    def __init__(self, nc: nats.aio.client.Client, run_id: str, query: ServedQuery) -> None:
        self.nc = nc
        self.run_id = run_id
        self.query = query
        self._sub: Subscription | None = None
        self._serving: set[asyncio.Task[None]] = set()
        self.served = 0

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(query_subject(self.run_id), cb=self._take)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None
        for t in list(self._serving):
            t.cancel()
        await asyncio.gather(*self._serving, return_exceptions=True)

    async def _take(self, msg: Msg) -> None:
        # each request in a task of its own: the recorder answers several at once (a cursor
        # each), so one long view query does not hold up the others' answers
        t = asyncio.create_task(self._serve(msg))
        self._serving.add(t)
        t.add_done_callback(self._serving.discard)

    async def _serve(self, msg: Msg) -> None:
        if not msg.reply:
            return
        try:
            req = msgspec.msgpack.decode(msg.data, type=QueryRequest)
            table = await self.query(
                req.sql, req.params, after=req.after, barrier=req.after is None
            )
            data = to_ipc(table)
        except Exception as exc:  # the caller must see why; the service keeps serving
            error = clipped(" ".join(repr(exc).split()))  # one line
            await self.nc.publish(msg.reply, b"", headers={"Stacx-Error": error})
            return
        chunks = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)] or [b""]
        for i, chunk in enumerate(chunks):
            await self.nc.publish(msg.reply, chunk, headers={"Stacx-Chunk": f"{i}/{len(chunks)}"})
        self.served += 1


def remote_query(
    nc: nats.aio.client.Client, run_id: str, *, timeout: float = TIMEOUT_S
) -> QueryAfter:
    """A query function for a remote actor: sends the SQL, its parameters and ``after`` (None:
    all published when served) and reassembles the chunked Arrow reply."""

    async def query(sql: str, params: Params = None, /, *, after: int | None = None) -> pa.Table:
        inbox = nc.new_inbox()
        parts: dict[int, bytes] = {}
        total: list[int] = []
        done = asyncio.get_running_loop().create_future()

        async def on_reply(msg: Msg) -> None:
            headers = msg.headers or {}
            if "Stacx-Error" in headers:
                if not done.done():
                    done.set_exception(
                        QueryError(f"query failed in the launcher: {headers['Stacx-Error']}")
                    )
                return
            index, _, n = headers.get("Stacx-Chunk", "0/1").partition("/")
            parts[int(index)] = msg.data
            total[:] = [int(n)]
            if len(parts) == total[0] and not done.done():
                done.set_result(None)

        sub = await nc.subscribe(inbox, cb=on_reply)
        try:
            wire = (
                None
                if params is None
                else (dict(params) if isinstance(params, Mapping) else list(params))
            )
            request = msgspec.msgpack.encode(QueryRequest(sql=sql, params=wire, after=after))
            await nc.publish(query_subject(run_id), request, reply=inbox)
            try:
                await asyncio.wait_for(done, timeout)
            except TimeoutError as exc:
                raise QueryError(
                    f"no answer from the launcher's query service on {query_subject(run_id)} "
                    f"within {timeout:.0f} s (is the launcher alive?)"
                ) from exc
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        return from_ipc(b"".join(parts[i] for i in range(total[0])))

    return query

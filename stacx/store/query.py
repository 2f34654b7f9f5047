"""The log's read contract (``Query``: SQL over the run's log with bound parameters) and SQL
over the log from another process: a NATS request/reply service the launcher serves.

Actors placed on Ray run in other processes (maybe other machines) but ``ActorContext.query``
must see the same log as local actors: the recorder, the only DuckDB writer, lives in the
launcher. So the launcher serves ``stacxq.<run_id>`` (outside the run's stream subjects
``stacx.<run_id>.>``, so nothing here is recorded): a request is a msgpack ``QueryRequest``
(the SQL, its bound parameters, and the stream sequence ``after`` that the answer must
include); the reply is the result as Arrow IPC stream bytes, split into chunks of at most
``CHUNK`` bytes (NATS caps a message at 1 MiB by default) published to the requester's inbox,
each with the header ``Stacx-Chunk: i/n``; a failure is one message with ``Stacx-Error``.

Guarantee: the reply reflects every event up to stream sequence ``after`` (a remote actor's
context sends its watermark: what it published or was delivered, so it reads its own writes,
as a local one does); a request without ``after`` waits for everything published before it
was *served* (the global barrier). Limits: one reply is materialized in the launcher's memory;
requests are served one at a time (DuckDB has one writer connection anyway).
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

log = logging.getLogger(__name__)

Params: TypeAlias = Sequence[object] | Mapping[str, object] | None
"""DuckDB bound parameters: a sequence for ``?``/``$1`` placeholders, a mapping for ``$name``."""


class Query(Protocol):
    """SQL over the run's log (views included) with bound parameters: ``query(sql, params)``.

    Values never go into the SQL text: ``query("... WHERE episode_id = ?", [episode_id])``."""

    def __call__(self, sql: str, params: Params = None, /) -> Awaitable[pa.Table]: ...


class QueryAfter(Protocol):
    """A ``Query`` that first waits until the recorder has committed stream sequence ``after``
    (``None``: the implementation's default; see ``RunContext.query``)."""

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
        self.served = 0

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(query_subject(self.run_id), cb=self._serve)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

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
            await self.nc.publish(msg.reply, b"", headers={"Stacx-Error": _one_line(repr(exc))})
            return
        chunks = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)] or [b""]
        for i, chunk in enumerate(chunks):
            await self.nc.publish(msg.reply, chunk, headers={"Stacx-Chunk": f"{i}/{len(chunks)}"})
        self.served += 1


def _one_line(text: str) -> str:
    return " ".join(text.split())[:4000]


def remote_query(
    nc: nats.aio.client.Client, run_id: str, *, timeout: float = TIMEOUT_S
) -> QueryAfter:
    """A query function for a remote actor: sends the SQL, its parameters and the sequence the
    answer must include (``after``; None: everything published when it is served), and
    reassembles the chunked Arrow reply."""

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

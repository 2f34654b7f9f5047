"""The HTTP boundary's retries against a real aiohttp server that never answers in time: a
request that may have arrived is sent again only when the caller says it is idempotent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from stacx.errors import EngineError
from stacx.inference.http import HttpClient


class Slow:
    """A server whose every answer comes after the client gave up; it counts what arrived."""

    def __init__(self) -> None:
        self.arrived: list[str] = []
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        self.arrived.append(request.path)
        await self.release.wait()
        return web.json_response({})


@pytest.fixture
async def slow() -> AsyncIterator[tuple[Slow, str]]:
    server = Slow()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield server, f"http://127.0.0.1:{port}"
    server.release.set()
    await runner.cleanup()


async def test_a_generate_that_timed_out_is_not_sent_again(slow: tuple[Slow, str]) -> None:
    server, url = slow
    client = HttpClient(url, timeout_s=0.3, retries=2)
    try:
        with pytest.raises(EngineError, match="/generate failed"):
            await client.request("POST", "/generate", {"input_ids": [[1]]})
        with pytest.raises(EngineError, match="/update_weights_from_disk failed"):
            await client.request("POST", "/update_weights_from_disk", {"model_path": "x"})
        assert server.arrived == ["/generate", "/update_weights_from_disk"]
        # a read the caller marks idempotent (and a GET) is retried: 1 + retries sends
        with pytest.raises(EngineError):
            await client.request("POST", "/generate", {}, idempotent=True)
        with pytest.raises(EngineError):
            await client.request("GET", "/health")
        assert server.arrived[2:] == ["/generate"] * 3 + ["/health"] * 3
    finally:
        await client.close()

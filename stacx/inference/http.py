"""The HTTP boundary shared by the SGLang and OpenAI clients: a session per event loop, retries
with capped backoff, and every non-2xx answer an :class:`EngineError` with the server's message.
A request that may have reached the server is retried only when idempotent (never a generate).
Design: docs/engine.md#the-openai-client
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from stacx.errors import EngineError


class HttpClient:
    def __init__(
        self,
        base_url: str,
        *,
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
        retries: int = 3,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = headers or {}
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=10)
        self.retries = retries
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            # a session is bound to its loop; a new loop (or a closed session) needs a new one
            self._session = aiohttp.ClientSession(
                headers=self.headers,
                timeout=self.timeout,
                connector=aiohttp.TCPConnector(limit=256),
            )
            self._loop = loop
        return self._session

    async def request(
        self, method: str, path: str, body: object = None, *, idempotent: bool | None = None
    ) -> object:
        """JSON (or text) answer of ``method path``; raises EngineError on failure. `idempotent`
        (default: a GET is, nothing else) allows a retry after the request may have arrived."""
        safe = method == "GET" if idempotent is None else idempotent
        delay = 0.5
        for attempt in range(self.retries + 1):
            try:
                async with self._get_session().request(
                    method, self.base_url + path, json=body
                ) as resp:
                    text = await resp.text()
                    if resp.status >= 400:
                        raise EngineError(
                            f"{method} {self.base_url}{path} -> HTTP {resp.status}: {text[:500]}"
                        )
                    if resp.content_type == "application/json":
                        return await resp.json()
                    return text
            except (TimeoutError, aiohttp.ClientConnectionError) as e:
                # ClientConnectorError: no connection was made, so nothing was sent
                sent = not isinstance(e, aiohttp.ClientConnectorError)
                if attempt == self.retries or (sent and not safe):
                    raise EngineError(f"{method} {self.base_url}{path} failed: {e!r}") from e
                await asyncio.sleep(delay)
                delay = min(delay * 2, 4.0)
        raise AssertionError("unreachable")

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            with contextlib.suppress(RuntimeError):  # its loop is gone
                await self._session.close()
        self._session = None

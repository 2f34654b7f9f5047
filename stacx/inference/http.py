"""The HTTP boundary shared by the SGLang and OpenAI clients: sessions, retries, errors.

Owns one real boundary (slime's rule): a session per event loop (a client object may outlive
the loop it was first used on, as in tests and in the launcher), retries with capped backoff
(a server that is restarting), and every non-2xx answer turned into an :class:`EngineError`
that carries the server's message.

Retries: a request the server never received (the connection could not be made) is always
retried. One that may have reached it (a timeout, a connection dropped mid-request) is retried
only when the caller says it is idempotent (``idempotent=True``: reads such as ``/health`` or
scoring); a ``/generate`` or a weight update is never sent twice, its failure is the caller's.
"""

from __future__ import annotations

import asyncio

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
            try:
                await self._session.close()
            except RuntimeError:  # its loop is gone
                pass
        self._session = None

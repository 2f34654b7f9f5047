"""The viewer's aiohttp application: routes, the loopback guard, errors as pages. It binds 127.0.0.1
only and refuses a Host header that is not its own address (no DNS rebinding); no route writes.

Design: docs/view.md#what-the-viewer-guarantees
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from stacx.errors import StacxError
from stacx.view import cost, episode, load, pages
from stacx.view.html import esc, page
from stacx.view.source import Source

STATIC = Path(__file__).parent / "static"
SOURCE = web.AppKey("source", Source)
Page = Callable[[Source, pages.Params], str]

ROUTES: dict[str, tuple[str, Page]] = {
    "/": ("runs", pages.runs_page),
    "/episodes": ("episodes", pages.episodes_page),
    "/episode": ("episode", episode.episode_page),
    "/lineage": ("lineage", pages.lineage_page),
    "/cost": ("drift & cost", cost.cost_page),
    "/load": ("time & load", load.load_page),
    "/sql": ("SQL", pages.sql_page),
    "/compare": ("compare", pages.compare_page),
}
NAV = [(path, title) for path, (title, _) in ROUTES.items() if path != "/episode"]


def _handler(title: str, render: Page) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        source = request.app[SOURCE]
        params = dict(request.query)
        label = " · ".join(str(d) for d in source.run_dirs)
        shown, status = title, 200
        try:
            body = await asyncio.to_thread(render, source, params)
        except pages.BadRequest as exc:
            shown, body, status = "bad request", f'<pre class="error">{esc(exc)}</pre>', 400
        text = page(shown, body, runs=label, nav=NAV)
        return web.Response(text=text, status=status, content_type="text/html")

    return handle


def make_app(source: Source, port: int) -> web.Application:
    allowed = {f"127.0.0.1:{port}", f"localhost:{port}"}

    @web.middleware
    async def loopback_only(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.host not in allowed:
            return web.Response(status=421, text=f"this viewer answers as {sorted(allowed)} only")
        return await handler(request)

    app = web.Application(middlewares=[loopback_only])
    app[SOURCE] = source
    for path, (title, render) in ROUTES.items():
        app.router.add_get(path, _handler(title, render))
    app.router.add_static("/static", STATIC)

    async def close(_: web.Application) -> None:
        source.close()

    app.on_cleanup.append(close)
    return app


async def serve(source: Source, port: int, *, ready: Callable[[str], None]) -> None:
    """Serve until cancelled; ``ready`` gets the URL once the socket listens."""
    runner = web.AppRunner(make_app(source, port), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", port)
        try:
            await site.start()
        except OSError as exc:
            raise StacxError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror}") from exc
        ready(f"http://127.0.0.1:{port}/")
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()

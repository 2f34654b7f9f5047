"""`stacx serve`: the in-process engine behind SGLang's native API and OpenAI routes."""

from __future__ import annotations

import contextlib

import click

from stacx.cli._common import PORT, friendly_errors, option, require_free_port
from stacx.errors import StacxError


@click.command()
@option(
    "--model",
    default="default",
    help="'default' (SmolLM2-135M-Instruct), an HF checkpoint directory, or a hub id.",
)
@option("--host", default="127.0.0.1")
@option("--port", default=30000, type=PORT, help="0 picks a free port.")
@option("--device", default="auto", help="auto | cpu | cuda | cuda:N")
@click.option("--max-batch", type=int, help="Concurrent requests (default 32 CPU, 64 CUDA).")
@option("--max-len", default=8192, type=int, help="Longest prompt + output.")
@click.option(
    "--threads", type=int, help="CPU threads for torch (default: 1 on <= 2 cores, else torch's)."
)
@click.option(
    "--model-alias",
    "aliases",
    multiple=True,
    help="Another name OpenAI/Anthropic requests may use for the model (repeatable); the "
    "--model value and the checkpoint's path and directory name are always served.",
)
@friendly_errors
def cli(
    model: str,
    host: str,
    port: int,
    device: str,
    max_batch: int | None,
    max_len: int,
    threads: int | None,
    aliases: tuple[str, ...],
) -> None:
    """Serve a model over HTTP: SGLang's native API, the OpenAI API and the Anthropic Messages API.

    SGLang's POST /generate, /update_weights_from_disk, /flush_cache, GET /health,
    /get_model_info; OpenAI's /v1/models[/{id}], /v1/completions, /v1/chat/completions (tools,
    tool_choice, response_format, streaming); POST /v1/messages; all from the same engine. A
    request naming another model than --model / --model-alias gets 404 model_not_found. Prints
    `listening on http://HOST:PORT` once the model is loaded and the port is bound."""
    import asyncio

    from aiohttp import web

    require_free_port(host, port)  # before the model loads, not after

    from stacx.inference.server import Server
    from stacx.inference.torch_engine import TorchEngine

    async def main() -> None:
        engine = await asyncio.to_thread(
            TorchEngine, model, device=device, max_batch=max_batch, max_len=max_len, threads=threads
        )
        if engine.graphed:  # kernel builds and graph captures before the first request, not in it
            await engine.warm_up()
        server = Server(engine, model_name=model, aliases=aliases)
        runner = web.AppRunner(server.app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:  # taken while the model loaded
            await engine.close()
            raise StacxError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        bound = runner.addresses[0][1] if runner.addresses else port
        click.echo(f"listening on http://{host}:{bound}", err=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()
            await engine.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())

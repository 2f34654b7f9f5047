"""Shared CLI plumbing: error policy (one line naming the cause, exit 2) and table output."""

from __future__ import annotations

import asyncio
import csv
import functools
import io
import json
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import click

from stacx.errors import StacxError

if TYPE_CHECKING:
    from stacx.actors.run import RunContext
    from stacx.launch.launcher import Outcome
    from stacx.launch.recipe import Recipe

P = ParamSpec("P")
R = TypeVar("R")
FC = TypeVar("FC", bound=Callable[..., Any])


def friendly_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn StacxError into a one-line message and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except StacxError as exc:
            click.echo(f"stacx: error: {exc}", err=True)
            sys.exit(2)

    return wrapper


PORT = click.IntRange(0, 65535)  # the type of every --port option (0: a free one)


def require_free_port(host: str, port: int) -> None:
    """Fail now, in one line, if ``host:port`` cannot be bound (port 0 always binds)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise StacxError(f"--host {host}: {exc.strerror or exc}") from exc
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds
        try:
            s.bind(addr)
        except OSError as exc:
            raise StacxError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc


# click.option that shows its default in --help (a None or empty default shows nothing)
option = functools.partial(click.option, show_default=True)


def run_dir_option(help: str) -> Callable[[FC], FC]:
    return click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), help=help)


def set_option(help: str) -> Callable[[FC], FC]:
    return click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE", help=help)


def launch_or_exit(
    recipe: Recipe,
    run_dir: Path,
    prepare: Callable[[RunContext], Coroutine[object, object, None]] | None = None,
) -> Outcome:
    """`launch` (stacx.launch.launcher) with progress on stderr; Ctrl-C or SIGTERM: exit 130."""
    from stacx.launch.launcher import launch

    echo = functools.partial(click.echo, err=True)
    try:
        return run_interruptible(launch(recipe, run_dir, echo=echo, prepare=prepare))
    except KeyboardInterrupt:
        echo(f"\ninterrupted; actors stopped. Resume with the same command (run dir {run_dir}).")
        sys.exit(130)


# the --format of every command that prints a table (render's formats)
format_option = option(
    "--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table"
)


def render(
    columns: Sequence[str], rows: Sequence[Sequence[object]], fmt: str, title: str | None = None
) -> str:
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(columns)
        w.writerows(rows)
        return buf.getvalue().rstrip("\n")
    if fmt == "json":
        return "\n".join(json.dumps(dict(zip(columns, r, strict=True)), default=str) for r in rows)
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for c in columns:
        table.add_column(str(c))
    for r in rows:
        table.add_row(*("NULL" if v is None else _short(v) for v in r))
    console = Console(file=io.StringIO(), width=200, force_terminal=False)
    console.print(table)
    out: str = console.file.getvalue()  # type: ignore[attr-defined]
    return out.rstrip("\n")


def _short(v: object, limit: int = 80) -> str:
    s = str(v)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def run_interruptible(main: Coroutine[object, object, R]) -> R:
    """`asyncio.run(main)` where SIGTERM stops it as Ctrl-C does (the main task cancelled, so all
    shuts down through its own cleanup), for `kill PID` and batch schedulers."""

    async def guarded() -> R:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        signalled: list[int] = []

        def stop(sig: int) -> None:
            signalled.append(sig)
            task.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop, sig)
        try:
            return await main
        except asyncio.CancelledError:
            if signalled:
                raise KeyboardInterrupt from None
            raise
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    return asyncio.run(guarded())

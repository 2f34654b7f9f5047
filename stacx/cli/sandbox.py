"""`stacx sandbox`: the sandbox service (`serve`, stacx.sandbox.service) and its admin commands
across every live service on NATS, or, without a NATS URL, `ls` and `gc` on this host's Docker.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import click

from stacx.cli._common import format_option, friendly_errors, option, render, run_interruptible
from stacx.errors import ConfigError

if TYPE_CHECKING:
    import aiodocker
    from nats.aio.client import Client as NATS

    from stacx.sandbox.gc import SandboxInfo
    from stacx.sandbox.remote_wire import Request, SandboxRow

T = TypeVar("T")
URL_HELP = "NATS server(s) of the sandbox services (default: $STACX_NATS_URL)."


def _url(url: str | None, *, required: bool) -> str | None:
    from stacx.bus.server import external_url

    found = url or external_url()
    if required and not found:
        raise ConfigError("--url: no NATS server given (pass --url or set STACX_NATS_URL)")
    return found


async def _with_nats(url: str, body: Callable[[NATS], Awaitable[T]]) -> T:
    from stacx.bus.client import connect

    nc = await connect(url, name="stacx-sandbox-admin")
    try:
        return await body(nc)
    finally:
        await nc.close()


async def _with_docker(body: Callable[[aiodocker.Docker], Awaitable[T]]) -> T:
    import aiodocker

    async with aiodocker.Docker() as docker:
        return await body(docker)


def _each(url: str, req: Request) -> list[SandboxRow]:
    """One admin request to every live service; their rows, concatenated."""
    from stacx.sandbox.remote import admin_call
    from stacx.sandbox.remote_hosts import discover

    async def ask(nc: NATS) -> list[SandboxRow]:
        hosts = await discover(nc, wait=1.0)
        replies = await asyncio.gather(*(admin_call(nc, h.service_id, req) for h in hosts))
        return [row for reply in replies for row in reply.rows or []]

    return run_interruptible(_with_nats(url, ask))


def _echo_rows(done: str, rows: list[SandboxRow], noun: str = "sandbox(es)") -> None:
    """What an admin command did to how many sandboxes, then their table if any."""
    click.echo(f"{done} {len(rows)} {noun}")
    if rows:
        click.echo(render(ROW_COLUMNS, _row_values(rows), "table"))


ROW_COLUMNS = ["service", "sandbox", "run_id", "episode_id", "image", "age_s", "idle_s"]


def _row_values(rows: list[SandboxRow], *, memory: bool = False) -> list[tuple[object, ...]]:
    return [
        (
            r.service_id,
            r.sandbox_id[:12],
            r.run_id,
            r.episode_id,
            r.image,
            round(r.age_s, 1),
            round(r.idle_s, 1),
            *((None if r.memory_mb is None else round(r.memory_mb, 1),) if memory else ()),
        )
        for r in rows
    ]


@click.group()
def cli() -> None:
    """The sandbox service, and every host's sandbox containers."""


# ---- serve -------------------------------------------------------------------------------------


@cli.command("serve")
@click.option("--url", help=URL_HELP)
@click.option("--id", "service_id", help="Service id (default: <hostname>-<random>).")
@click.option("--slots", type=click.IntRange(min=1), help="Sandboxes at once.")
@click.option("--cpus", type=click.FloatRange(min=0.1), help="CPUs it may use.")
@click.option("--memory-mb", type=click.IntRange(min=64), help="Memory it may use.")
@option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path.home() / ".cache" / "stacx" / "sandbox-service",
    help="Where received task directories are kept (by content digest).",
)
@click.option(
    "--aliases", default="", help="Base-image alias file (default: $STACX_IMAGE_ALIASES)."
)
@option("--heartbeat", type=click.FloatRange(min=0.05), default=1.0)
@click.option(
    "--runtime",
    type=click.Choice(["runc", "runsc"]),
    help="OCI runtime of its sandboxes (runsc: gVisor). Default: $STACX_SANDBOX_RUNTIME or runc.",
)
@option(
    "--lease",
    type=click.FloatRange(min=1.0),
    default=60.0,
    help="Seconds without a client's renewal before its sandbox is stopped.",
)
@friendly_errors
def serve(
    url: str | None,
    service_id: str | None,
    slots: int | None,
    cpus: float | None,
    memory_mb: int | None,
    state_dir: Path,
    aliases: str,
    heartbeat: float,
    lease: float,
    runtime: str | None,
) -> None:
    """Serve this host's sandboxes on NATS until SIGTERM or Ctrl-C (which remove them)."""
    import logging

    from stacx.sandbox.remote_wire import subject_token
    from stacx.sandbox.service import (
        SandboxService,
        ServiceConfig,
        default_capacity,
        default_service_id,
        default_slots,
    )

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    host_cpus, host_mem = default_capacity()
    cpus, memory_mb = cpus or host_cpus, memory_mb or host_mem
    config = ServiceConfig(
        url=str(_url(url, required=True)),
        service_id=subject_token(service_id) if service_id else default_service_id(),
        slots=slots or default_slots(cpus, memory_mb),
        cpus=cpus,
        memory_mb=memory_mb,
        state_dir=str(state_dir),
        aliases=aliases,
        heartbeat_s=heartbeat,
        lease_s=lease,
        runtime=runtime or "",
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await SandboxService(config).run(
            stop,
            ready=lambda: click.echo(
                f"sandbox service {config.service_id}: {config.slots} slots, "
                f"{config.cpus:g} cpus, {config.memory_mb} MB, on {config.url}",
                err=True,
            ),
        )

    asyncio.run(main())  # signals: handled by main (a clean stop)


# ---- admin -------------------------------------------------------------------------------------


@cli.command("hosts")
@click.option("--url", help=URL_HELP)
@option("--wait", type=float, default=1.0, help="Seconds to collect.")
@format_option
@friendly_errors
def hosts(url: str | None, wait: float, fmt: str) -> None:
    """Every live sandbox service: slots used/free, cpus, memory, images, age."""
    from stacx.sandbox.remote_hosts import discover

    adverts = run_interruptible(
        _with_nats(str(_url(url, required=True)), lambda nc: discover(nc, wait=wait))
    )
    now = time.time()
    rows = [
        (
            a.service_id,
            a.host,
            a.pid,
            a.slots,
            a.used,
            a.slots - a.used,
            a.cpus,
            a.memory_mb,
            len(a.tasks),
            ",".join(a.runs),
            round(now - a.started_at, 1),
        )
        for a in adverts
    ]
    columns = [
        "service",
        "host",
        "pid",
        "slots",
        "used",
        "free",
        "cpus",
        "memory_mb",
        "images",
        "runs",
        "age_s",
    ]
    click.echo(render(columns, rows, fmt))


@cli.command("ls")
@click.option("--url", help=URL_HELP)
@click.option("--local", is_flag=True, help="This host's Docker engine, not the services.")
@format_option
@friendly_errors
def ls(url: str | None, local: bool, fmt: str) -> None:
    """Every sandbox of every live service, by run and episode (or this host's containers)."""
    from stacx.sandbox.gc import list_sandboxes
    from stacx.sandbox.remote_wire import AdminLs, admin_token

    found = None if local else _url(url, required=False)
    if found is None:
        click.echo(render(COLUMNS, _rows(run_interruptible(_with_docker(list_sandboxes))), fmt))
        return
    rows = _each(found, AdminLs(run_id="", token=admin_token()))
    click.echo(render(ROW_COLUMNS, _row_values(rows), fmt))


@cli.command("stats")
@click.option("--url", help=URL_HELP)
@format_option
@friendly_errors
def stats(url: str | None, fmt: str) -> None:
    """Every live service's sandboxes with their memory use, and totals per service."""
    from stacx.sandbox.remote_wire import AdminLs, admin_token

    rows = _each(str(_url(url, required=True)), AdminLs(run_id="", token=admin_token(), stats=True))
    click.echo(render([*ROW_COLUMNS, "memory_mb"], _row_values(rows, memory=True), fmt))
    if fmt == "table":
        memory: dict[str, float] = defaultdict(float)
        for r in rows:
            memory[r.service_id] += r.memory_mb or 0.0
        counts = sorted(Counter(r.service_id for r in rows).items())
        totals = [(s, n, round(memory[s], 1)) for s, n in counts]
        click.echo(render(["service", "sandboxes", "memory_mb"], totals, fmt))


@cli.command("stop")
@click.argument("sandbox_id", required=False, default="")
@click.option("--run-id", default="", help="Stop every sandbox of this run.")
@click.option("--url", help=URL_HELP)
@friendly_errors
def stop(sandbox_id: str, run_id: str, url: str | None) -> None:
    """Stop a sandbox (by id prefix) or every sandbox of a run, on whichever service holds it."""
    from stacx.sandbox.remote_wire import AdminStop, admin_token

    if not sandbox_id and not run_id:
        raise ConfigError("stop: name a SANDBOX_ID (a prefix) or --run-id")
    make = AdminStop(run_id="", token=admin_token(), sandbox_id=sandbox_id, of_run=run_id)
    _echo_rows("stopped", _each(str(_url(url, required=True)), make))


@cli.command("gc")
@click.option("--dry-run", is_flag=True, help="Only list what would be removed.")
@click.option("--run-id", help="Remove every sandbox of this run, owner alive or not.")
@click.option("--url", help=URL_HELP)
@click.option("--local", is_flag=True, help="This host's Docker engine, not the services.")
@friendly_errors
def gc_(dry_run: bool, run_id: str | None, url: str | None, local: bool) -> None:
    """Remove sandboxes whose owning process is gone (on every service's host, or here)."""
    from stacx.sandbox.gc import collect_garbage
    from stacx.sandbox.remote_wire import AdminGc, admin_token

    verb = "would remove" if dry_run else "removed"
    found = None if local else _url(url, required=False)
    if found is None:
        removed = run_interruptible(
            _with_docker(lambda docker: collect_garbage(docker, dry_run=dry_run, run_id=run_id))
        )
        click.echo(f"{verb} {len(removed)} sandbox container(s)")
        if removed:
            click.echo(render(COLUMNS, _rows(removed), "table"))
        return
    make = AdminGc(run_id="", token=admin_token(), dry_run=dry_run, of_run=run_id)
    _echo_rows(verb, _each(found, make), "sandbox container(s)")


# ---- this host's Docker engine -----------------------------------------------------------------


def _rows(infos: list[SandboxInfo]) -> list[tuple[object, ...]]:
    return [
        (
            s.id,
            s.name,
            s.image,
            s.state,
            s.run_id,
            s.episode_id,
            s.pid,
            {True: "alive", False: "ORPHAN", None: f"other host ({s.host})"}[s.alive],
        )
        for s in infos
    ]


COLUMNS = ["id", "name", "image", "state", "run_id", "episode_id", "pid", "owner"]

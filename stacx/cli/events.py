"""`stacx events RUN_DIR [--kind K] [--follow]`: print a run's events as JSON lines."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import click

from stacx.cli._common import friendly_errors
from stacx.errors import StacxError
from stacx.events import KINDS
from stacx.store import db
from stacx.store.schema import TABLES, to_builtins


def _rows(
    run_dir: Path, kinds: list[str], after: int, limit: int | None
) -> list[dict[str, object]]:
    with db.connect_run(run_dir) as con:
        out: list[dict[str, object]] = []
        for k in kinds:
            t = TABLES[k].name
            cur = con.execute(f'select * from "{t}" where _seq > ? order by _seq', [after])
            cols = [d[0] for d in cur.description or []]
            out += [{**dict(zip(cols, r, strict=True)), "kind": k} for r in cur.fetchall()]
        out.sort(key=lambda r: int(r["_seq"]))  # type: ignore[call-overload]
        return out[-limit:] if limit else out


async def _follow_live(url: str, run_id: str, kinds: list[str]) -> None:
    from nats.aio.msg import Msg

    from stacx.bus.client import connect
    from stacx.wire import decode_many

    nc = await connect(url, name="stacx-events")
    subs = (
        [f"stacx.{run_id}.{k}" for k in kinds] if len(kinds) < len(KINDS) else [f"stacx.{run_id}.>"]
    )
    queue: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_msg(m: Msg) -> None:
        queue.put_nowait(m.data)

    for s in subs:
        await nc.subscribe(s, cb=on_msg)
    while True:
        for event in decode_many(await queue.get()):
            click.echo(json.dumps(to_builtins(event), default=str))


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--kind", "kinds", multiple=True, help="Event kind(s), e.g. TurnGenerated.")
@click.option("--follow", is_flag=True, help="Keep printing new events as they are recorded.")
@click.option("--limit", type=int, help="Only the last N events.")
@friendly_errors
def cli(run_dir: Path, kinds: tuple[str, ...], follow: bool, limit: int | None) -> None:
    """Print RUN_DIR's events (JSON lines, in stream order)."""
    db.require_run(run_dir)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise StacxError(
            f"unknown kind(s) {', '.join(unknown)}; accepted: {', '.join(sorted(KINDS))}"
        )
    chosen = list(kinds) or sorted(KINDS)
    seen = 0
    for row in _rows(run_dir, chosen, 0, limit):
        seen = max(seen, int(row["_seq"]))  # type: ignore[call-overload]
        click.echo(json.dumps(row, default=str))
    if not follow:
        return
    meta = db.read_run_file(run_dir)
    if meta.get("status") == "running" and meta.get("nats_url"):
        # live run: tail the bus itself (core NATS subscription; no consumer state is created)
        asyncio.run(_follow_live(str(meta["nats_url"]), str(meta["run_id"]), chosen))
        return
    while True:  # a finished run that may be resumed: poll the file
        time.sleep(1.0)
        for row in _rows(run_dir, chosen, seen, None):
            seen = max(seen, int(row["_seq"]))  # type: ignore[call-overload]
            click.echo(json.dumps(row, default=str))

"""Live progress from the log by one SQL query (never in-memory counters, so a resumed run shows the
whole run): a rich panel on a TTY, else a plain line per refresh in which something changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time

import msgspec
from rich.console import Console
from rich.live import Live
from rich.table import Table

from stacx.actors.base import Query

PROGRESS_SQL = """
SELECT
  (SELECT count(*) FROM episodes WHERE status = 'scored') AS scored,
  (SELECT count(*) FROM episodes WHERE status IN ('running', 'finished')) AS in_flight,
  (SELECT count(*) FROM episodes WHERE status = 'failed') AS failed,
  (SELECT avg(reward) FROM episodes WHERE status = 'scored') AS reward_mean,
  (SELECT avg(reward) FROM (SELECT reward FROM episodes WHERE status = 'scored'
                            ORDER BY finished_ts DESC LIMIT 16)) AS reward_recent,
  (SELECT max(step) FROM train_steps) AS step,
  (SELECT arg_max(loss, step) FROM train_steps) AS loss,
  (SELECT coalesce(max(version), 0) FROM weights_published) AS version,
  (SELECT count(DISTINCT group_id) FROM task_scheduled) AS groups,
  (SELECT coalesce(string_agg(failure_kind || '=' || n, ' ' ORDER BY failure_kind), '')
     FROM (SELECT failure_kind, count(*) AS n FROM infra_failed GROUP BY failure_kind)) AS failures
"""


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    scored: int = 0
    in_flight: int = 0
    failed: int = 0
    reward_mean: float | None = None
    reward_recent: float | None = None
    step: int | None = None
    loss: float | None = None
    version: int = 0
    groups: int = 0
    failures: str = ""


async def snapshot(query: Query) -> Snapshot:
    row = (await query(PROGRESS_SQL)).to_pylist()[0]
    return msgspec.convert(row, Snapshot)


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def line(s: Snapshot, steps: int | None) -> str:
    step = "-" if s.step is None else str(s.step)
    total = f"/{steps}" if steps else ""
    return (
        f"episodes scored={s.scored} in_flight={s.in_flight} failed={s.failed} groups={s.groups} "
        f"reward={_f(s.reward_mean)} recent={_f(s.reward_recent)} step={step}{total} "
        f"loss={_f(s.loss)} weights=v{s.version} failures=[{s.failures or 'none'}]"
    )


def table(s: Snapshot, title: str, steps: int | None, elapsed: float) -> Table:
    t = Table(title=f"{title}  ({elapsed:.0f} s)", show_header=False, box=None)
    t.add_column(style="bold")
    t.add_column()
    t.add_row(
        "episodes",
        f"{s.scored} scored, {s.in_flight} in flight, {s.failed} failed "
        f"({s.groups} groups scheduled)",
    )
    t.add_row("reward", f"mean {_f(s.reward_mean)}, last 16 {_f(s.reward_recent)}")
    if steps:
        t.add_row("step", f"{s.step if s.step is not None else 0}/{steps}, loss {_f(s.loss)}")
    t.add_row("weights", f"v{s.version}")
    t.add_row("failures", s.failures or "none")
    return t


class ProgressView:
    """Refreshes until cancelled. ``mode``: rich | plain | off | auto (rich on a TTY)."""

    def __init__(
        self,
        query: Query,
        *,
        title: str,
        steps: int | None,
        mode: str = "auto",
        interval_s: float = 2.0,
    ) -> None:
        self.query = query
        self.title = title
        self.steps = steps
        self.stream = sys.stderr
        self.mode = ("rich" if self.stream.isatty() else "plain") if mode == "auto" else mode
        self.interval_s = interval_s
        self.last: Snapshot | None = None

    async def run(self) -> None:
        if self.mode == "off":
            return
        t0 = time.monotonic()
        printed = ""
        with contextlib.ExitStack() as stack:
            if self.mode == "rich":
                live = Live(console=Console(file=self.stream), auto_refresh=False, transient=False)
                stack.enter_context(live)
            while True:
                s = self.last = await snapshot(self.query)
                elapsed = time.monotonic() - t0
                if self.mode == "rich":
                    live.update(table(s, self.title, self.steps, elapsed), refresh=True)
                elif (text := line(s, self.steps)) != printed:
                    print(f"[{elapsed:6.0f}s] {text}", file=self.stream, flush=True)
                    printed = text
                await asyncio.sleep(self.interval_s)

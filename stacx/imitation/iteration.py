"""One imitation iteration as log queries: schedule roll-ins, then wait until the log says done.

DAgger / AggreVaTe / OPD iterate "roll in -> teacher signal -> train". This module owns the
first two as plain functions over a run's ``emit`` and ``query`` (the launcher, the gap
experiment and the tests share them); training is the trainer's (or ``stacx.imitation.fit``).

Done means, from the log alone (so a resumed run waits for exactly what is missing):

- every scheduled sample of the iteration is scored, or failed for good (InfraFailed with
  ``will_retry = false``);
- DAgger: no visited state of the iteration waits for a label (``labels_pending_sql``);
- OPD: no student turn waits for a teacher score (``scores_pending_sql``);
- AggreVaTe: every scored parent has its k branch outcomes (``branches_pending_sql``).

Limits: a teacher label that failed for good (InfraFailed(engine), published without an episode
id) leaves its state pending; `wait_iteration` then ends at its timeout with `IterationTimeout`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pyarrow as pa

from stacx.errors import StacxError
from stacx.events import Emit, TaskScheduled, derive_id
from stacx.imitation.aggrevate import branches_pending_sql
from stacx.imitation.config import ImitationConfig
from stacx.imitation.teacher import labels_pending_sql, scores_pending_sql
from stacx.sandbox.tasks import Task

Query = Callable[[str], Awaitable[pa.Table]]


class IterationTimeout(StacxError):
    """An iteration did not complete in time; the message says what was still pending."""


def samples_done_sql(iteration: int) -> str:
    return f"""SELECT count(*) FROM (
    SELECT e.group_id, e.sample_index FROM episodes e
    LEFT JOIN infra_failed f ON f.episode_id = e.episode_id
    WHERE e.iteration = {int(iteration)} AND e.policy IN ('student', 'mixture')
    GROUP BY 1, 2
    HAVING bool_or(e.status = 'scored') OR bool_or(f.will_retry = false))"""


def group_id_for(run_id: str, iteration: int, task_id: str) -> str:
    return derive_id(run_id, "imitation", iteration, task_id)


async def schedule_iteration(
    emit: Emit, run_id: str, tasks: list[Task], iteration: int, n_samples: int = 1
) -> None:
    """One TaskScheduled per task (derived ids: a rerun schedules nothing new)."""
    for task in tasks:
        group = group_id_for(run_id, iteration, task.task_id)
        await emit(
            TaskScheduled(
                run_id=run_id,
                event_id=derive_id(group, "TaskScheduled"),
                task_id=task.task_id,
                task_path=task.path,
                group_id=group,
                n_samples=n_samples,
                iteration=iteration,
            )
        )


async def _count(query: Query, sql: str) -> int:
    return int((await query(sql)).column(0)[0].as_py())


async def pending(
    query: Query,
    config: ImitationConfig,
    iteration: int,
    n_samples_total: int,
    label_actors: list[str],
) -> dict[str, int]:
    """What the iteration still waits for (all zeros: done)."""
    out = {"samples": n_samples_total - await _count(query, samples_done_sql(iteration))}
    if config.name == "dagger":
        out["labels"] = await _count(query, labels_pending_sql(iteration, label_actors))
    elif config.name == "opd":
        out["scores"] = await _count(query, scores_pending_sql())
    else:
        out["branches"] = await _count(query, branches_pending_sql(iteration, config.branches))
    return out


async def wait_iteration(
    query: Query,
    config: ImitationConfig,
    iteration: int,
    n_samples_total: int,
    label_actors: list[str],
    *,
    timeout_s: float = 3600.0,
    poll_s: float = 1.0,
    progress: Callable[[dict[str, int]], None] | None = None,
) -> None:
    """Until `pending` is all zeros; `IterationTimeout` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last: dict[str, int] = {}
    while True:
        now = await pending(query, config, iteration, n_samples_total, label_actors)
        if progress is not None and now != last:
            progress(now)
        last = now
        if all(v <= 0 for v in now.values()):
            return
        if time.monotonic() > deadline:
            raise IterationTimeout(
                f"iteration {iteration} still pending after {timeout_s:.0f} s: {now}"
            )
        await asyncio.sleep(poll_s)

"""Presets: `stacx eval` and `stacx tasks check` as recipes run by the one launcher. Each builds an
eval :class:`Recipe` from its flags (validated like a file), launches it, and computes what it
prints by SQL over the run's log; a rerun on the same directory resumes.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import msgspec
import pyarrow as pa

from stacx.actors.base import Params
from stacx.errors import ConfigError, StacxError
from stacx.launch.launcher import Outcome, launch
from stacx.launch.loader import convert
from stacx.launch.recipe import Recipe, resolve_tasks
from stacx.rollout import report
from stacx.store.db import connect_run

Progress = Literal["auto", "rich", "plain", "off"]
Echo = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# ---- stacx eval --------------------------------------------------------------------------------


def eval_recipe(
    *,
    tasks: str,
    model: str = "default",
    agent: str = "swe",
    n_samples: int = 1,
    include: Sequence[str] = (),
    difficulty: Sequence[str] = (),
    limit: int | None = None,
    concurrency: int = 2,
    max_turns: int = 6,
    max_new_tokens: int = 256,
    temperature: float = 0.7,
    format: str = "tool_call",
    max_attempts: int = 3,
    episode_timeout_s: float | None = None,
    seed: int | None = 0,
    name: str = "eval",
    progress: Progress = "auto",
    backend: Literal["docker", "process", "auto"] = "auto",
) -> Recipe:
    """`stacx eval`'s flags as a recipe (every task once, `n_samples` samples each); ``backend =
    "auto"``: the process sandbox when every task is an image-less answer task, else Docker."""
    if backend == "auto":
        backend = "process" if _all_answer_tasks(tasks) else "docker"
    return _eval_recipe(
        {
            "name": name,
            "model": {"path": model},
            "tasks": {
                "path": tasks,
                "include": list(include),
                "difficulty": list(difficulty),
                "limit": limit,
                "group_size": n_samples,
            },
            "agent": {
                **_agent_keys(agent, format, seed),
                "max_turns": max_turns,
                "max_new_tokens": max_new_tokens,
                "temperature": temperature,
                "episode_timeout_s": episode_timeout_s,
            },
            "sandbox": {
                "backend": backend,
                "concurrency": concurrency,
                "max_attempts": max_attempts,
            },
        },
        progress,
        "stacx eval",
    )


def _eval_recipe(data: dict[str, object], progress: Progress, source: str) -> Recipe:
    logging = {"progress": progress, "tensorboard": False, "plot": False}
    return convert({**data, "algorithm": {"name": "eval"}, "logging": logging}, source=source)


def _agent_keys(agent: str, format: str, seed: int | None) -> dict[str, object]:
    """--agent NAME or installed:<scaffold> as [agent] keys (a scaffold has no format, no seed)."""
    name, _, scaffold = agent.partition(":")
    if not scaffold:
        return {"name": name, "format": format, "seed": seed}
    if format != "tool_call":
        raise ConfigError(f"--format {format}: not used by an installed scaffold ({agent})")
    return {"name": name, "scaffold": scaffold}


def _all_answer_tasks(spec: str) -> bool:
    from stacx.harbor.tasks import load_tasks
    from stacx.sandbox.answers import is_answer_task

    try:
        tasks = load_tasks(resolve_tasks(spec))
    except StacxError:
        return False  # the recipe's own validation reports the bad path
    return bool(tasks) and all(is_answer_task(t) for t in tasks)


class EvalResult(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    run_dir: str
    verdict: str  # the launcher's: "completed", or "stopped" when interrupted
    tables: list[tuple[str, report.Table]]  # (title, (sql, columns, rows)), in print order
    unscored: int  # samples that ended with infrastructure failures only
    skipped_tasks: list[str]  # an oracle eval's tasks without solution/solve.sh


async def run_eval(recipe: Recipe, run_dir: Path, *, echo: Echo = _stderr) -> EvalResult:
    """Launch an eval recipe into `run_dir`, then compute its report from the log."""
    outcome = await launch(recipe, run_dir, echo=echo)
    tables = await read_report(Path(outcome.run_dir), recipe.tasks.group_size)
    unscored_rows = tables[-1][1][2]
    unscored = int(unscored_rows[0][0]) if unscored_rows else 0  # type: ignore[call-overload]
    return EvalResult(
        run_id=outcome.run_id,
        run_dir=outcome.run_dir,
        verdict=outcome.verdict,
        tables=tables,
        unscored=unscored,
        skipped_tasks=outcome.skipped_tasks,
    )


async def read_report(run_dir: Path, k: int) -> list[tuple[str, report.Table]]:
    """The eval report of a (finished) run, by SQL over its log."""
    with connect_run(run_dir) as con:

        async def query(sql: str, params: Params = None, /) -> pa.Table:
            return con.sql(sql, params=params).to_arrow_table()

        return await report.report(query, k)


# ---- stacx tasks check -------------------------------------------------------------------------

CheckAgent = Literal["oracle", "null"]


class CheckRow(msgspec.Struct, frozen=True, kw_only=True):
    task_id: str
    agent: str
    ok: bool  # scored, and the score meets the agent's bar
    reward: float | None = None
    failure: str | None = None  # a FailureKind, or "no_solution" (an oracle without solve.sh)
    reason: str = ""
    duration_ms: float = 0.0
    episode_id: str = ""


def passes(agent: str, reward: float) -> bool:
    """The bar: the oracle must score 1.0; the null agent must not (else the task tests nothing)."""
    return reward >= 1.0 if agent == "oracle" else reward < 1.0


def check_recipe(
    source: str | Path,
    agent: CheckAgent,
    *,
    concurrency: int = 2,
    aliases: str = "",
    progress: Progress = "off",
) -> Recipe:
    """`stacx tasks check`'s flags as a recipe: one sample and one attempt per task (an
    infrastructure failure is reported, not retried)."""
    return _eval_recipe(
        {
            "name": f"tasks-check-{agent}",
            "tasks": {"path": str(Path(source).resolve()), "group_size": 1},
            # the oracle: its solution, then submit; the null agent: submit
            "agent": {"name": agent, "max_turns": 2},
            "sandbox": {"concurrency": concurrency, "max_attempts": 1, "aliases": aliases},
            # a check is of the verifier: a task's rubric (stacx.rubric) is not scored
            "judge": {"use": "off"},
        },
        progress,
        "stacx tasks check",
    )


async def check_tasks(
    source: str | Path,
    agent: CheckAgent,
    *,
    run_dir: Path | None = None,
    concurrency: int = 2,
    aliases: str = "",
    progress: Progress = "off",
    echo: Echo = _stderr,
) -> tuple[Path, list[CheckRow]]:
    """Check every task of `source` with `agent` in `run_dir` (None: a new temp dir, kept for
    queries); returns the run dir and one row per task, by task id."""
    recipe = check_recipe(
        source, agent, concurrency=concurrency, aliases=aliases, progress=progress
    )
    run_dir = run_dir or Path(tempfile.mkdtemp(prefix=f"stacx-check-{agent}-"))
    outcome = await launch(recipe, run_dir, echo=echo)
    rows = await asyncio.to_thread(check_rows, outcome, agent)
    return Path(outcome.run_dir), rows


CHECK_SQL = """WITH attempt AS (
    SELECT * FROM episodes
    QUALIFY row_number() OVER (PARTITION BY task_id ORDER BY started_ts DESC) = 1
), failure AS (
    SELECT coalesce(episode_id, task_id) AS key,
           arg_max(failure_kind, ts) AS failure_kind, arg_max(message, ts) AS message
    FROM infra_failed GROUP BY 1
), step AS (  -- a multi-step task's step that could not start (its setup.sh / healthcheck)
    SELECT episode_id, arg_max('step ' || step || ': ' || message, ts) AS message
    FROM step_failed GROUP BY 1
), first_call AS (
    SELECT episode_id, exit_code, timed_out, output FROM tool_returned
    QUALIFY row_number() OVER (PARTITION BY episode_id ORDER BY turn) = 1
)
SELECT s.task_id, a.episode_id, a.status, a.reward,
       coalesce(fe.failure_kind, ft.failure_kind) AS failure_kind,
       coalesce(fe.message, ft.message, sf.message, '') AS message,
       coalesce((a.finished_ts - a.started_ts) * 1000, 0) AS duration_ms,
       c.exit_code, c.timed_out, c.output
FROM (SELECT DISTINCT task_id FROM task_scheduled) s
LEFT JOIN attempt a USING (task_id)
LEFT JOIN failure fe ON fe.key = a.episode_id
LEFT JOIN failure ft ON ft.key = s.task_id
LEFT JOIN step sf ON sf.episode_id = a.episode_id
LEFT JOIN first_call c ON c.episode_id = a.episode_id
ORDER BY s.task_id"""


def check_rows(outcome: Outcome, agent: str) -> list[CheckRow]:
    """One verdict per task from the check's log, plus failures for tasks with no solve.sh."""
    with connect_run(outcome.run_dir) as con:
        found = con.sql(CHECK_SQL).to_arrow_table().to_pylist()
    rows = [_row(r, agent) for r in found]
    rows += [
        CheckRow(task_id=t, agent=agent, ok=False, failure="no_solution", reason="no solve.sh")
        for t in outcome.skipped_tasks
    ]
    return sorted(rows, key=lambda r: r.task_id)


def _row(r: dict[str, object], agent: str) -> CheckRow:
    reward = r["reward"] if r["status"] == "scored" else None
    ok = isinstance(reward, float) and passes(agent, reward)
    reason = str(r["message"] or "")
    if reward is None and not r["failure_kind"]:
        reason = f"not scored (episode {r['status'] or 'never started'})"
    elif reward is not None and not ok and agent == "oracle" and r["exit_code"] is not None:
        tail = str(r["output"] or "").strip().splitlines()[-1:]
        reason = f"solve.sh exit {r['exit_code']}" + (f": {tail[0]}" if tail else "")
    elif reward is not None and not ok and r["timed_out"]:
        reason = "solve.sh timed out"
    return CheckRow(
        task_id=str(r["task_id"]),
        agent=agent,
        ok=ok,
        reward=reward if isinstance(reward, float) else None,
        failure=None if r["failure_kind"] is None or reward is not None else str(r["failure_kind"]),
        reason=reason,
        duration_ms=float(r["duration_ms"] or 0.0),  # type: ignore[arg-type]
        episode_id=str(r["episode_id"] or ""),
    )

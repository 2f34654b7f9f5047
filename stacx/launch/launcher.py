"""The launcher: one recipe -> one run (RunContext), its roles placed, a scheduler, progress and
metrics, until the log says the run is done; then a clean stop and a plot. Guarantees: it holds no
state that matters: kill -9 at any point and the same command continues from the log, ending with
the counts of an uninterrupted run.
Design: docs/concepts/actors.md#the-launcher
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec

from stacx.actors.run import RunContext
from stacx.errors import ConfigError, TaskError
from stacx.launch.loader import ConfigDict, to_dict
from stacx.launch.metrics import MetricsWriter, make_sinks
from stacx.launch.placement import LocalPlacement, Placement, RayPlacement, resolve_builder
from stacx.launch.plan import RoleSpec, roles_for
from stacx.launch.processes import ProcessPlacement
from stacx.launch.progress import ProgressView, Snapshot, snapshot
from stacx.launch.recipe import Recipe, resolve_tasks
from stacx.launch.resume import Previous, check_resume, remove_orphan_sandboxes
from stacx.schedule.scheduler import EvalPlan, Plan, Scheduler, TaskRef, eval_versions

log = logging.getLogger(__name__)


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    run_dir: str
    attempt: int
    resumed: bool
    final: Snapshot | None
    plot: str | None
    verdict: str  # "completed", "starved: ...", or "stopped" (interrupted before the end)
    skipped_tasks: list[str] = []  # selected, but left out (an oracle run: no solve.sh)


def selection(recipe: Recipe) -> tuple[list[TaskRef], list[str], list[str]]:
    """(tasks to schedule, tasks an oracle run leaves out, notes on task.toml keys not honoured). A
    selected task that does not load is scheduled all the same, to fail alone in its worker."""
    from fnmatch import fnmatchcase

    from stacx.harbor.tasks import load_task_set, select

    t = recipe.tasks

    def matches(task_id: str, patterns: list[str]) -> bool:
        return any(fnmatchcase(task_id, p) for p in patterns)

    def kept(task_id: str, include: list[str], exclude: list[str]) -> bool:
        return (not t.include or matches(task_id, include)) and not matches(task_id, exclude)

    try:
        loaded, broken = load_task_set(resolve_tasks(t.path))
        every = sorted([x.task_id for x in loaded] + [b.task_id for b in broken])
        broken = [b for b in broken if kept(b.task_id, t.include, t.exclude) and not t.difficulty]
        # a pattern that names only tasks that do not load selects those (they fail alone)
        ids = [x.task_id for x in loaded]
        include = [p for p in t.include if any(fnmatchcase(i, p) for i in ids)]
        exclude = [p for p in t.exclude if any(fnmatchcase(i, p) for i in ids)]
        for key, patterns in (("include", t.include), ("exclude", t.exclude)):
            loose = [p for p in patterns if not any(fnmatchcase(i, p) for i in every)]
            if loose:
                raise TaskError(
                    f"tasks.{key}: {loose} match no task id; accepted: {', '.join(every)}"
                )
        chosen = [x for x in loaded if kept(x.task_id, include, exclude)]
        tasks = select(chosen, difficulty=t.difficulty, limit=t.limit) if chosen else []
    except TaskError as exc:
        raise ConfigError(f"{exc} (in {t.path})") from None
    if not tasks and not broken:
        raise ConfigError(f"{t.path}: no task left after include/exclude/difficulty/limit")
    skipped: list[str] = []
    if recipe.agent.name == "oracle":
        skipped = [x.task_id for x in tasks if not x.has_solution]
        tasks = [x for x in tasks if x.has_solution]
        if not tasks and not broken:
            raise ConfigError(
                f"agent.name = 'oracle': no selected task in {t.path} has solution/solve.sh"
            )
    notes = [f"task {x.task_id}: {n}" for x in tasks for n in x.notes]
    notes += [f"task {b.task_id}: cannot be loaded: {b.reason}" for b in broken]
    refs = [TaskRef(x.task_id, str(x.path)) for x in tasks]
    refs += [TaskRef(b.task_id, b.path) for b in broken]
    return sorted(refs, key=lambda r: r.task_id), skipped, notes


def scheduler_plan(recipe: Recipe, tasks: list[TaskRef]) -> Plan:
    return Plan(
        tasks=tasks,
        per_iteration=recipe.tasks.per_iteration,
        group_size=recipe.tasks.group_size,
        seed=recipe.tasks.seed,
        steps=recipe.trainer.steps,
        mode=recipe.algorithm.mode,
        max_staleness=recipe.algorithm.max_staleness,
        eval=recipe.is_eval,
        max_iterations=recipe.tasks.max_iterations,
        trainer=None if recipe.is_eval else recipe.trainer,
        evals=eval_plan(recipe),
    )


def eval_plan(recipe: Recipe) -> EvalPlan | None:
    """The recipe's periodic eval ([eval]), its task set selected like [tasks]."""
    ev = recipe.eval
    if ev.every == 0:
        return None
    tasks = msgspec.structs.replace(
        recipe.tasks,
        path=ev.path or recipe.tasks.path,
        include=ev.include,
        exclude=ev.exclude,
        difficulty=ev.difficulty,
        limit=ev.limit,
    )
    refs = selection(msgspec.structs.replace(recipe, tasks=tasks))[0]
    versions = eval_versions(ev.every, recipe.trainer.steps, at_start=ev.at_start)
    return EvalPlan(tasks=refs, samples=ev.samples, versions=versions)


def make_placement(run: RunContext, recipe: Recipe) -> Placement:
    mode = recipe.placement_mode
    if mode == "ray":
        return RayPlacement(run, recipe)
    if mode == "processes":
        return ProcessPlacement(run, recipe)
    return LocalPlacement(run, recipe)


@contextlib.asynccontextmanager
async def open_run(
    run_dir: Path, name: str, config: ConfigDict, *, attempt: ConfigDict | None = None
) -> AsyncIterator[tuple[RunContext, Previous | None]]:
    """The one way a run is opened or continued (by `launch`, ``stacx regrade``, ``stacx import
    harbor`` and the benches): the resume rules first (stacx.launch.resume: a live launcher, or
    a log of another recipe than `config`, is refused), then RunContext (NATS, the recorder,
    RunStarted with `config` and `attempt`'s keys: what this attempt does beyond the recipe).
    Yields the run and its previous attempts' facts (None: a fresh run)."""
    previous = await asyncio.to_thread(check_resume, run_dir, config)
    async with RunContext(run_dir, recipe=name, config={**config, **(attempt or {})}) as run:
        yield run, previous


async def launch(
    recipe: Recipe,
    run_dir: Path,
    *,
    roles: list[RoleSpec] | None = None,
    echo: Callable[[str], None] = print,
    poll_s: float = 3.0,
    prepare: Callable[[RunContext], Awaitable[None]] | None = None,
) -> Outcome:
    """Run (or resume) `recipe` in `run_dir` until done."""
    config = to_dict(recipe)
    tasks, skipped, notes = await asyncio.to_thread(selection, recipe)
    plan = scheduler_plan(recipe, tasks)
    roles = roles_for(recipe) if roles is None else roles
    for role in roles:
        resolve_builder(role.builder)  # a wrong path fails now, before anything starts
    if recipe.sandbox.backend == "remote":  # no NATS to reach the services: fail before starting
        from stacx.sandbox.remote import remote_url

        remote_url(recipe.sandbox.url)
    async with open_run(run_dir, recipe.name, config) as (run, previous):
        if previous is not None:
            removed = await remove_orphan_sandboxes(run.run_id)
            echo(
                f"resuming run {run.run_id} in {run.run_dir} (attempt {run.attempt + 1}); "
                f"continuing from its log"
                + (f"; removed {removed} orphan sandboxes" if removed else "")
            )
        if skipped:
            echo(f"skipped (no solution/solve.sh for the oracle): {', '.join(skipped)}")
        for note in notes:  # task.toml keys not honoured, and tasks that do not load
            echo(f"note: {note}")
        if prepare is not None:  # e.g. `stacx replay` imports past episodes before anything starts
            await prepare(run)
        scheduler = Scheduler(plan, poll_s=poll_s)
        final = await _drive(run, recipe, roles, scheduler, config)
        attempt = run.attempt
    return Outcome(
        run_id=run.run_id,
        run_dir=str(run.run_dir),
        attempt=attempt,
        resumed=previous is not None,
        final=final,
        plot=await _plot(recipe, run.run_dir),
        verdict=scheduler.verdict or "stopped",
        skipped_tasks=skipped,
    )


async def _drive(
    run: RunContext,
    recipe: Recipe,
    roles: list[RoleSpec],
    scheduler: Scheduler,
    config: dict[str, object],
) -> Snapshot | None:
    """Place the roles and the scheduler, run metrics and progress until done (or an actor crashed),
    stop everything; returns the final progress snapshot, read once the recorder caught up."""
    placement = make_placement(run, recipe)
    lg = recipe.logging
    metrics = MetricsWriter(
        run.query, lambda: make_sinks(run.run_dir, run.run_id, config, lg), interval_s=lg.interval_s
    )
    progress = ProgressView(
        run.query,
        title=f"{recipe.name} · {run.run_id}",
        steps=None if recipe.is_eval else recipe.trainer.steps,
        mode=lg.progress,
        interval_s=lg.interval_s,
    )
    background = [asyncio.create_task(metrics.run()), asyncio.create_task(progress.run())]
    final: Snapshot | None = None
    try:
        for role in roles:
            await placement.start(role)
        run.spawn(scheduler)
        while not scheduler.done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(scheduler.done.wait(), 2.0)
            await placement.check()
    except (asyncio.CancelledError, KeyboardInterrupt):
        run.interrupted()  # the roles' in-flight work is cancelled, not waited for
        raise
    finally:
        for t in background:
            t.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await placement.stop()
        try:  # every actor is stopped: the last metrics and the final snapshot see it all
            await run.sync(30)
        except Exception:
            log.exception("the recorder did not catch up before the final metrics")
        await metrics.finish()
        try:
            final = await snapshot(run.query)
        except Exception:
            log.exception("final progress snapshot not read")
    return final


async def _plot(recipe: Recipe, run_dir: Path) -> str | None:
    """The run's plot (``logging.plot``); None when off or when it could not be drawn."""
    if not recipe.logging.plot:
        return None
    try:
        from stacx.launch.plot import write_plot

        return str(await asyncio.to_thread(write_plot, run_dir))
    except Exception as exc:  # a plot is a convenience; the run itself succeeded
        log.warning("plot not written: %r", exc)
        return None

"""`stacx regrade RUN`: new grades for a run's recorded episodes, recorded in its own log as one
more attempt, opened as every run is (`stacx.launch.launcher.open_run`). Guarantees: a diverged
replay is reported, never graded; rerunning with the same grader changes nothing; an
infrastructure failure is never a grade; a live run is refused.
Design: docs/regrade.md#per-episode
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import msgspec

from stacx.actors.run import RunContext
from stacx.agents.loop import Tools
from stacx.agents.swe import SweTools
from stacx.agents.tools import Observation, execute
from stacx.errors import ConfigError, EngineError, SandboxError, StacxError, TaskError
from stacx.events import (
    Emit,
    EpisodeNotRegraded,
    RegradeIssue,
    RewardAssigned,
    clipped,
    derive_id,
)
from stacx.harbor.tasks import load_task, load_task_set
from stacx.launch.launcher import open_run
from stacx.launch.loader import ConfigDict, convert
from stacx.launch.placement import ActorEnv
from stacx.launch.recipe import Recipe, resolve_tasks
from stacx.launch.resume import read_previous
from stacx.launch.roles import agent_config, docker_environments
from stacx.launch.scripted import SOLVE_COMMAND, run_solution
from stacx.ports import Environments, InfraFailure, Sandbox, Task, Verdict
from stacx.regrade.graders import Grader, Replayed
from stacx.regrade.judging import JudgePlan, judge_plan, open_grader
from stacx.regrade.replay import RecordedCall, RunCall, recorded_calls, replay
from stacx.store import db
from stacx.store.episodes_io import EpisodeRecord, read_records, select_episodes
from stacx.toolcalls import ToolCall

# the default selection: every episode whose agent loop ended (an infra-failed attempt that
# never finished has no final state to rebuild)
ENDED = "stop_reason IS NOT NULL AND stop_reason <> 'error'"
_IDS = re.compile(r"^[0-9a-f]{32}(\s*,\s*[0-9a-f]{32})*$")


class Target(msgspec.Struct, frozen=True, kw_only=True):
    """One episode to regrade: its record, the task to grade it by (None: none), the task it ran."""

    record: EpisodeRecord
    agent: str
    policy: str
    task: Task | None
    recorded_task: Task | None
    missing: str = ""  # why `task` is None


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """What the regrade did to one episode (a row of the CLI's report)."""

    episode_id: str
    task_id: str
    grader: str
    old_reward: float | None
    new_reward: float | None = None
    issue: str = ""  # a RegradeIssue, "skipped" (already done by this grader), or "" (graded)
    message: str = ""


def selection(episodes: str | None) -> str:
    """The SQL predicate over `episodes` for ``--episodes`` (ids or SQL), ended episodes only."""
    if not episodes:
        return ENDED
    text = episodes.strip()
    if _IDS.match(text):
        ids = ", ".join(f"'{i.strip()}'" for i in text.split(","))
        return f"({ENDED}) AND episode_id IN ({ids})"
    return f"({ENDED}) AND ({text})"


def read_run(
    run_dir: Path, where: str, limit: int | None
) -> tuple[ConfigDict, Recipe, list[EpisodeRecord], dict[str, str]]:
    """The run's recorded recipe (as recorded, and read), the selected episodes' events and each
    group's task path. Refused: no log, no RunStarted, a live launcher, an unreadable recipe."""
    db.require_run(run_dir)
    previous = read_previous(run_dir)  # ConfigError when a launcher is alive on it
    if previous is None:
        raise ConfigError(f"{run_dir}: its log has no RunStarted; nothing to regrade")
    try:
        recipe = convert(_recipe_of(previous.config), source=f"{run_dir}'s recorded recipe")
    except ConfigError as exc:
        raise ConfigError(
            f"{run_dir}: its recorded recipe cannot be read by this STACX: {exc}"
        ) from exc
    with db.connect_run(run_dir) as con:
        try:
            con.execute(f"select count(*) from episodes where {where}").fetchall()
        except duckdb.Error as exc:
            raise StacxError(
                f"--episodes: {where} is not a valid predicate over the episodes view: {exc}"
            ) from exc
        if limit is not None:  # the first N by start, before their events are read
            ids = [r[1] for r in select_episodes(con, where)[:limit]]
            where = "episode_id IN (" + ", ".join(f"'{i}'" for i in ids) + ")" if ids else "false"
        paths = dict(
            con.execute(
                "select group_id, any_value(task_path) from task_scheduled group by 1"
            ).fetchall()
        )
    return previous.config, recipe, read_records(run_dir, where), paths


def _recipe_of(recorded: ConfigDict) -> ConfigDict:
    """The run's recipe; an imported run (`stacx import harbor`) has none: the defaults."""
    return {"name": "import"} if "import" in recorded else recorded


def done_before(run_dir: Path) -> set[tuple[str, str]]:
    """(episode, grader) pairs already graded, or reported as diverged / not replayable."""
    with db.connect_run(run_dir) as con:
        try:
            return {
                (str(e), str(g))
                for e, g in con.execute(
                    "select episode_id, to_json(r)->>'grader' from reward_assigned r "
                    "where coalesce(to_json(r)->>'grader', '') <> '' "
                    "union all select episode_id, grader from episode_not_regraded where issue <> 'infra'"
                ).fetchall()
            }
        except duckdb.Error:  # a log older than the grader field and EpisodeNotRegraded: none
            return set()


def targets(
    records: list[EpisodeRecord], paths: dict[str, str], tasks: Path | None
) -> list[Target]:
    """Each episode with its tasks (docs/regrade.md#per-episode, step 1)."""
    recorded: dict[str, Task | None] = {}
    for path in {paths[r.group_id] for r in records if r.group_id in paths}:
        try:
            recorded[path] = load_task(path)
        except TaskError:
            recorded[path] = None
    given: dict[str, Task] | None = None
    if tasks is not None:
        loaded, _broken = load_task_set(resolve_tasks(str(tasks), where="--tasks"))
        given = {t.task_id: t for t in loaded}
    out = []
    for r in records:
        start = next((e for e in r.events if e["kind"] == "EpisodeStarted"), {})
        ran = recorded.get(paths.get(r.group_id, ""))
        task = ran if given is None else given.get(r.task_id)
        missing = ""
        if task is None and given is not None:
            missing = f"task {r.task_id!r} is not in --tasks {tasks}"
        elif task is None:
            path = paths.get(r.group_id, "(none: imported episode)")
            missing = f"task {r.task_id!r}: its recorded path {path} does not load; give --tasks"
        out.append(
            Target(
                record=r,
                agent=str(start.get("agent", "")),
                policy=str(start.get("policy", "")),
                task=task,
                recorded_task=ran or task,
                missing=missing,
            )
        )
    return out


def run_call(target: Target, tools: Tools) -> RunCall:
    """How one episode's recorded calls run again: its agent's tool adapter, or the oracle's
    solve.sh."""

    async def run(call: RecordedCall, sandbox: Sandbox) -> Observation | None:
        solution = target.recorded_task
        if (
            target.policy == "oracle"
            and solution is not None
            and isinstance(tools, SweTools)
            and call.tool == "bash"
            and call.arguments.get("command") == SOLVE_COMMAND
        ):
            return await execute(
                ToolCall(name="bash", arguments=call.arguments),
                sandbox,
                tools.limits,
                run_solution(solution),
            )
        return await tools.replay(call.tool, call.arguments, sandbox)

    return run


def not_replayable(target: Target) -> str:
    """Why the episode's actions cannot be replayed, or ''."""
    if target.agent == "installed":
        return (
            "an installed scaffold's episode: its tool executions ran inside the scaffold, "
            "and the log holds its model calls, not its actions"
        )
    if target.task is not None and target.task.step_tasks:
        return "a multi-step task: replaying its steps is not supported"
    return ""


class Regrader:
    """One regrade: the graders' events published through `emit` (the run's context)."""

    def __init__(
        self,
        *,
        run_id: str,
        attempt: int,
        envs: Environments,
        grader: Grader,
        recipe: Recipe,
        emit: Emit,
        artifacts_dir: Path,
    ) -> None:
        self.run_id, self.attempt, self.envs, self.grader = run_id, attempt, envs, grader
        self.artifacts_dir = artifacts_dir  # <run>/artifacts: what episodes left, by episode id
        self.recipe = recipe
        self.emit = emit
        self._slots = asyncio.Semaphore(max(1, recipe.sandbox.concurrency))

    async def one(self, target: Target, done: set[tuple[str, str]]) -> Outcome:
        r = target.record
        base = Outcome(episode_id=r.episode_id, task_id=r.task_id, grader="", old_reward=r.reward)
        if target.task is None:
            return await self._not_regraded(base, RegradeIssue.NO_TASK, target.missing)
        grader = self.grader.name(target.task)
        base = msgspec.structs.replace(base, grader=grader)
        if (r.episode_id, grader) in done:
            return msgspec.structs.replace(
                base, issue="skipped", message="already regraded by this grader"
            )
        left = self.artifacts_dir / r.episode_id
        kept = left if self.grader.from_artifacts(target.task, left) else None
        why = not_replayable(target)
        if why and self.grader.replays and kept is None:
            return await self._not_regraded(base, RegradeIssue.NOT_REPLAYABLE, why)
        async with self._slots:
            try:
                verdict = await self._replay_and_grade(target, base, kept)
            except (InfraFailure, SandboxError, EngineError, TaskError, OSError) as exc:
                return await self._not_regraded(
                    base, RegradeIssue.INFRA, f"{type(exc).__name__}: {exc}"
                )
        if isinstance(verdict, Outcome):
            return verdict
        await self.emit(
            RewardAssigned(
                run_id=self.run_id,
                event_id=derive_id(r.episode_id, "RewardAssigned", grader),
                episode_id=r.episode_id,
                reward=verdict.reward,
                metrics_json=json.dumps({"reward": verdict.reward, **verdict.metrics}),
                verifier_ms=verdict.verifier_ms,
                verifier_output=verdict.output,
                grader=grader,
            )
        )
        how = "from its artifacts" if kept is not None else "replayed"
        return msgspec.structs.replace(base, new_reward=verdict.reward, message=how)

    async def _replay_and_grade(
        self, target: Target, base: Outcome, kept: Path | None
    ) -> Verdict | Outcome:
        task = target.task
        assert task is not None
        record = target.record
        sandbox_id = derive_id(record.episode_id, "regrade", base.grader)
        if not self.grader.replays or kept is not None:
            return await self.grader.grade(
                Replayed(
                    record=record, task=task, sandbox=None, sandbox_id=sandbox_id, artifacts=kept
                )
            )
        tools = agent_config(self.recipe).tools.for_task(task)
        async with self.envs.sandbox(task, episode_id=sandbox_id) as sandbox:
            diverged = await replay(recorded_calls(record), sandbox, run_call(target, tools))
            if diverged is not None:
                c, got = diverged.call, diverged.replayed
                return await self._not_regraded(
                    base,
                    RegradeIssue.DIVERGED,
                    diverged.message,
                    turn=c.turn,
                    tool=c.tool,
                    recorded_exit_code=c.exit_code,
                    replayed_exit_code=got.exit_code,
                    recorded_output=clipped(c.output or ""),
                    replayed_output=clipped(got.output),
                )
            return await self.grader.grade(
                Replayed(record=record, task=task, sandbox=sandbox, sandbox_id=sandbox_id)
            )

    async def _not_regraded(
        self, base: Outcome, issue: RegradeIssue, message: str, **diverged: Any
    ) -> Outcome:
        """Report the episode as not regraded (`diverged`: the diverging call's fields)."""
        # an infra failure gets an id per attempt: the next regrade retries it
        key = (self.attempt,) if issue is RegradeIssue.INFRA else ()
        await self.emit(
            EpisodeNotRegraded(
                run_id=self.run_id,
                event_id=derive_id(base.episode_id, "EpisodeNotRegraded", base.grader, *key),
                episode_id=base.episode_id,
                grader=base.grader,
                issue=issue,
                message=clipped(message),
                **diverged,
            )
        )
        return msgspec.structs.replace(base, issue=str(issue), message=message)


async def regrade(
    run_dir: Path,
    *,
    tasks: Path | None = None,
    episodes: str | None = None,
    limit: int | None = None,
    rubric: Path | None = None,
    judge_sets: list[str] | None = None,
    echo: Callable[[str], None] = print,
) -> list[Outcome]:
    """Regrade RUN's selected episodes: the tasks' verifiers, joined by a judge where a rubric
    applies (`rubric`; the recorded [judge] with `judge_sets`)."""
    where = selection(episodes)
    recorded, recipe, records, paths = await asyncio.to_thread(read_run, run_dir, where, limit)
    if not records:
        raise StacxError(f"{run_dir}: no episode matches {where}")
    chosen = await asyncio.to_thread(targets, records, paths, tasks)
    done = await asyncio.to_thread(done_before, run_dir)
    plan = await asyncio.to_thread(
        judge_plan,
        _recipe_of(recorded),  # its [judge]
        [t.task for t in chosen if t.task is not None],
        rubric,
        list(judge_sets or []),
    )
    # this attempt's RunStarted: the run's recipe, and what this regrade did
    regraded: ConfigDict = {
        "tasks": str(tasks or ""),
        "episodes": where,
        "limit": limit,
        "rubric": str(rubric or ""),
        "judge_sets": list(judge_sets or []),
    }
    echo(f"regrading {len(chosen)} episode(s) of {run_dir} on the {recipe.sandbox.backend} backend")
    async with open_run(run_dir, recipe.name, recorded, attempt={"regrade": regraded}) as (run, _):
        outcomes = await _regrade_in(run, recipe, plan, chosen, done, echo)
        await run.sync(60)
    return outcomes


async def _regrade_in(
    run: RunContext,
    recipe: Recipe,
    plan: JudgePlan,
    chosen: list[Target],
    done: set[tuple[str, str]],
    echo: Callable[[str], None],
) -> list[Outcome]:
    """Regrade `chosen` in `run`'s new attempt, with its sandboxes and grader opened for them."""
    env = ActorEnv(run_id=run.run_id, run_dir=str(run.run_dir), emit=run.emit, query=run.query)
    async with contextlib.AsyncExitStack() as stack:
        envs = await stack.enter_async_context(docker_environments(recipe, env))
        grader = await open_grader(stack, envs, env, plan, attempt=run.attempt)
        regrader = Regrader(
            run_id=run.run_id,
            attempt=run.attempt,
            envs=envs,
            grader=grader,
            recipe=recipe,
            emit=run.emit,
            artifacts_dir=run.run_dir / "artifacts",
        )

        async def one(t: Target) -> Outcome:
            outcome = await regrader.one(t, done)
            echo(describe(outcome))
            return outcome

        return list(await asyncio.gather(*(one(t) for t in chosen)))


def describe(o: Outcome) -> str:
    """One line per episode, as the regrade goes."""
    head = f"{o.episode_id[:12]} {o.task_id}:"
    if not o.issue:
        return f"{head} reward {o.old_reward} -> {o.new_reward} by {o.grader} ({o.message})"
    if o.issue == RegradeIssue.DIVERGED:
        return f"{head} DIVERGED, not regraded: {o.message}"
    return f"{head} not regraded ({o.issue}): {o.message}"

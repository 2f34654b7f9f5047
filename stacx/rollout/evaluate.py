"""The eval lane: schedule every task of a set, let rollout managers run them, report by SQL.

`evaluate` is what `stacx eval` runs, and what a test or notebook can call directly. It owns
the run's lifetime (a RunContext) and the engine's; it waits for completion by asking the log
(every sample scored, or failed for good), never by counting in memory, so a rerun on the same
run directory resumes: finished samples are skipped by the managers, the rest run.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import msgspec

from stacx.actors.run import RunContext
from stacx.agents.chat import ChatFormat, ChatTokenizer
from stacx.agents.formats import ActionFormat, FormatName, get_format
from stacx.agents.loop import AgentConfig
from stacx.agents.policies import EnginePolicy, Executor, always, null_policy, oracle_policy
from stacx.agents.tools import ToolLimits
from stacx.errors import ConfigError
from stacx.events import TaskScheduled, derive_id
from stacx.inference.engine import Engine
from stacx.rollout import report
from stacx.rollout.environments import DockerEnvironments
from stacx.rollout.manager import RolloutConfig, RolloutManager
from stacx.sandbox.tasks import Task, load_tasks, select

Progress = Callable[[int, int], None]


class EvalConfig(msgspec.Struct, frozen=True, kw_only=True):
    tasks: str
    model: str = "default"
    agent: str = "swe"  # swe | oracle | null
    n_samples: int = 1
    include: list[str] = []  # task ids or fnmatch patterns (empty: all)
    difficulty: list[str] = []  # metadata.difficulty values (empty: all)
    limit: int | None = None
    concurrency: int = 2
    max_turns: int = 6
    max_new_tokens: int = 256
    temperature: float = 0.7
    format: FormatName = "tool_call"  # how the agent writes actions (stacx.agents.formats)
    max_attempts: int = 3
    episode_timeout_s: float | None = None
    seed: int = 0
    poll_s: float = 1.0


class EvalResult(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    tables: list[tuple[str, report.Table]]
    unscored: int
    skipped_tasks: list[str]


def select_tasks(config: EvalConfig) -> tuple[list[Task], list[str]]:
    """The tasks to run (after --include/--difficulty/--limit) and those skipped (oracle
    without a solution)."""
    tasks = select(
        load_tasks(config.tasks),
        include=config.include,
        difficulty=config.difficulty,
        limit=config.limit,
        where="--tasks",
    )
    skipped: list[str] = []
    if config.agent == "oracle":
        skipped = [t.task_id for t in tasks if not t.has_solution]
        tasks = [t for t in tasks if t.has_solution]
        if not tasks:
            raise ConfigError(f"--agent oracle: no task in {config.tasks} has solution/solve.sh")
    return tasks, skipped


@contextlib.asynccontextmanager
async def _policy_source(config: EvalConfig) -> AsyncIterator[tuple[ChatFormat, Engine | None]]:
    """The chat format (always the model's template) and, for `swe`, a running engine."""
    if config.agent == "swe":
        from stacx.inference.torch_engine import TorchEngine

        engine = await asyncio.to_thread(TorchEngine, config.model)
        try:
            tokenizer: ChatTokenizer = engine.tokenizer  # type: ignore[assignment]
            yield ChatFormat(tokenizer), engine
        finally:
            await engine.close()
        return
    from transformers import AutoTokenizer

    from stacx.inference.models import resolve_model

    path = await asyncio.to_thread(resolve_model, config.model)
    loaded: ChatTokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, path)  # type: ignore[arg-type]
    yield ChatFormat(loaded), None


def executor_factory(
    agent: str, chat: ChatFormat, engine: Engine | None, fmt: ActionFormat | None = None
) -> Callable[[Task, int], Executor]:
    """(task, sample_index) -> a fresh executor for one episode of `agent` (scripted agents
    write their actions in `fmt`, the tool-call format by default)."""
    if agent == "swe":
        if engine is None:
            raise ConfigError("agent 'swe' needs an engine")
        policy = EnginePolicy(engine)
        return lambda _task, _i: always(policy)
    if agent == "oracle":
        return lambda task, _i: always(
            oracle_policy(chat, (task.solution_dir / "solve.sh").read_text(), fmt)
        )
    if agent == "null":
        return lambda _task, _i: always(null_policy(chat, fmt))
    raise ConfigError(f"--agent {agent!r}: accepted values are swe, oracle, null")


async def evaluate(
    config: EvalConfig, run_dir: Path, progress: Progress | None = None
) -> EvalResult:
    """Run the eval described by `config` into `run_dir`; see the module docstring."""
    tasks, skipped = select_tasks(config)
    agent_config = AgentConfig(
        max_turns=config.max_turns,
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature,
        seed=config.seed,
        format=config.format,
        tools=ToolLimits(),
    )
    async with (
        _policy_source(config) as (chat, engine),
        RunContext(run_dir, recipe="eval", config=msgspec.to_builtins(config)) as run,
    ):
        # The context budget is the engine's window when it says (the torch engine does).
        window = getattr(engine, "max_len", None)
        if isinstance(window, int) and window < agent_config.context_budget:
            agent_config = msgspec.structs.replace(agent_config, context_budget=window)
        return await _run(config, run, chat, engine, agent_config, tasks, skipped, progress)


async def _run(
    config: EvalConfig,
    run: RunContext,
    chat: ChatFormat,
    engine: Engine | None,
    agent_config: AgentConfig,
    tasks: list[Task],
    skipped: list[str],
    progress: Progress | None,
) -> EvalResult:
    rollout = RolloutConfig(
        agent=config.agent,
        policy="student" if config.agent == "swe" else config.agent,
        concurrency=config.concurrency,
        max_attempts=config.max_attempts,
        episode_timeout_s=config.episode_timeout_s,
        agent_config=agent_config,
    )
    async with DockerEnvironments(run_id=run.run_id, emit=run.emit) as envs:
        run.spawn(
            RolloutManager(
                config=rollout,
                envs=envs,
                chat=chat,
                make_executor=executor_factory(
                    config.agent, chat, engine, get_format(config.format)
                ),
            )
        )
        for task in tasks:
            await run.emit(
                TaskScheduled(
                    run_id=run.run_id,
                    event_id=derive_id(run.run_id, "TaskScheduled", task.task_id),
                    task_id=task.task_id,
                    task_path=task.path,
                    group_id=derive_id(run.run_id, "group", task.task_id),
                    n_samples=config.n_samples,
                    split="eval",
                )
            )
        await _wait(run.query, len(tasks) * config.n_samples, config, progress)
        await run.stop_actors()
    tables = await report.report(run.query, config.n_samples)
    unscored_rows = tables[-1][1][2]
    unscored = int(unscored_rows[0][0]) if unscored_rows else 0  # type: ignore[call-overload]
    return EvalResult(run_id=run.run_id, tables=tables, unscored=unscored, skipped_tasks=skipped)


async def _wait(
    query: report.Query, total: int, config: EvalConfig, progress: Progress | None
) -> None:
    """Until the log says every sample is done (scored, or failed for good)."""
    last = -1
    while True:
        done = int((await query(report.PROGRESS_SQL)).column(0)[0].as_py())
        lost = await query(
            "SELECT count(DISTINCT task_id) FROM infra_failed "
            "WHERE episode_id IS NULL AND task_id IS NOT NULL AND NOT will_retry"
        )
        done += int(lost.column(0)[0].as_py()) * config.n_samples
        if progress is not None and done != last:
            progress(min(done, total), total)
            last = done
        if done >= total:
            return
        await asyncio.sleep(config.poll_s)

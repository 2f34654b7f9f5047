"""The real role builders (see ``stacx.launch.plan``): recipe -> the actors of one role instance.
Each is an async context manager that starts what its actors need (engines, SGLang servers,
sandboxes), yields the actors and releases everything on exit, whichever placement runs it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import ClassVar

from stacx.actors.base import Actor
from stacx.agents.chat import ChatFormat
from stacx.agents.formats import get_format
from stacx.agents.loop import AgentConfig, loop_agents
from stacx.agents.mle import MleTools
from stacx.agents.policies import EnginePolicy, always
from stacx.agents.retool import RetoolTools
from stacx.agents.swe import SweTools
from stacx.errors import ConfigError
from stacx.events import Event, RollIn, TurnActor, WeightsLoaded, derive_id
from stacx.imitation.mixture import MixtureRollIn, MixtureRolloutManager
from stacx.launch import memory
from stacx.launch.engines import open_engine, open_tokenizer
from stacx.launch.judges import open_judge, open_teacher_engine
from stacx.launch.placement import ActorEnv
from stacx.launch.recipe import PYTHON_AGENTS, Recipe
from stacx.launch.scripted import scripted_executors
from stacx.ports import ChatTokenizer, Engine, Environments, MakeAgent
from stacx.rollout.manager import RolloutConfig, RolloutManager
from stacx.train.algorithms import Teacher
from stacx.weights.sync import NEWEST_DURABLE_SQL, WeightSync, load_published


class RolloutWorker(RolloutManager):
    """The rollout manager with a short ack wait: its heartbeats (every ack_wait/3) keep a live
    worker's task, while a dead worker's task comes back within seconds of a resume, not minutes."""

    ack_wait: ClassVar[float] = 15.0


class MixtureWorker(MixtureRolloutManager):
    """The DAgger/AggreVaTe roll-in manager, with the same short ack wait (see RolloutWorker)."""

    ack_wait: ClassVar[float] = RolloutWorker.ack_wait


def agent_config(recipe: Recipe) -> AgentConfig:
    """The agent loop's settings, with the recipe's agent as its tool adapter."""
    a = recipe.agent
    tools: SweTools | RetoolTools | MleTools
    if a.name == "retool":
        tools = RetoolTools(style="tool_call" if a.format == "tool_call" else "python")
    elif a.name == "mle":
        tools = MleTools(style="tool_call" if a.format == "tool_call" else "python")
    elif a.format == "python":  # the retool agent's (recipe.cross_check rejects it for swe)
        raise ConfigError("agent.format = 'python': the SWE agent writes tool_call or bash")
    else:
        tools = SweTools(format=a.format)
    return AgentConfig(
        max_turns=a.max_turns,
        max_new_tokens=a.max_new_tokens,
        temperature=a.temperature,
        top_p=a.top_p,
        context_budget=a.context_budget,
        seed=a.seed,
        tools=tools,
    )


def rollout_config(recipe: Recipe) -> RolloutConfig:
    scripted = {"oracle": RollIn.ORACLE, "null": RollIn.NULL}
    return RolloutConfig(
        agent=recipe.agent.name,
        policy=scripted.get(recipe.agent.name, RollIn.STUDENT),
        concurrency=recipe.sandbox.concurrency,
        max_attempts=recipe.sandbox.max_attempts,
        episode_timeout_s=recipe.agent.episode_timeout_s,
        judged=recipe.judge.use != "off",
    )


@contextlib.asynccontextmanager
async def rollout(recipe: Recipe, env: ActorEnv, index: int) -> AsyncIterator[list[Actor]]:
    """A student engine (kept on the latest weights), the environments and a rollout manager; for a
    scripted agent (oracle, null) no engine, only the model's tokenizer."""
    async with contextlib.AsyncExitStack() as stack:
        if recipe.scripted_agent:  # oracle / null: no model generates, only its tokenizer frames
            _, tokenizer = await open_tokenizer(recipe.model.path)
            chat = ChatFormat(tokenizer)
            envs = await stack.enter_async_context(docker_environments(recipe, env))
            make_agent = loop_agents(
                chat,
                agent_config(recipe),
                scripted_executors(recipe.agent.name, chat, get_format(recipe.agent.format)),
            )
            judge = await open_judge(stack, recipe, env)
            yield [
                RolloutWorker(
                    config=rollout_config(recipe), envs=envs, make_agent=make_agent, judge=judge
                )
            ]
            return
        sync: Actor
        if env.engine_url:  # the engine role serves every rollout worker (mode "processes")
            engine, tokenizer = await served_engine_client(stack, recipe, env)
            sync = ServedVersion(ENGINE_LABEL)
        else:
            engine, tokenizer = await student_engine(stack, recipe, env)
            sync = WeightSync(engine, label=f"rollout-{index}", handoff=env.handoff)
        chat = ChatFormat(tokenizer)
        make_installed: MakeAgent | None = None
        if recipe.agent.name == "installed":  # a black-box scaffold behind the model gateway
            from stacx.launch.scaffolds import installed_rollout

            envs, make_installed = await stack.enter_async_context(
                installed_rollout(recipe, env, engine, tokenizer)
            )
        else:
            envs = await stack.enter_async_context(docker_environments(recipe, env))
        student = EnginePolicy(engine, TurnActor.STUDENT)
        config = rollout_config(recipe)

        def serves() -> int:
            return sync.version if isinstance(sync, ServedVersion) else engine.weight_version

        if recipe.algorithm.algo.roll_in:
            teacher_engine, _ = await open_teacher_engine(stack, recipe, env)
            workers = imitation_workers(recipe, env, envs, chat, student, teacher_engine, serves)
        else:
            make_agent = make_installed or loop_agents(
                chat, agent_config(recipe), lambda _t, _i: always(student)
            )
            judge = await open_judge(stack, recipe, env, (engine, tokenizer))
            workers = [
                RolloutWorker(
                    config=config, envs=envs, make_agent=make_agent, serves=serves, judge=judge
                )
            ]
        yield [sync, *workers]


ENGINE_LABEL = "engine-0"  # the engine role's WeightSync (one engine per node)


class ServedVersion(Actor):
    """The weight version the engine role serves (from its ``WeightsLoaded``), what a rollout worker
    of ``processes`` placement waits on for a sync iteration."""

    name: ClassVar[str] = "served-version"
    kinds: ClassVar[tuple[type[Event], ...]] = (WeightsLoaded,)

    def __init__(self, label: str) -> None:
        self.label = label
        self.version = 0

    async def on_start(self) -> None:
        rows = await self.query(
            "SELECT max(version) AS v FROM weights_loaded WHERE engine = $1", [self.label]
        )
        self.version = max(self.version, int(rows.column("v")[0].as_py() or 0))

    async def handle(self, event: Event) -> None:
        if isinstance(event, WeightsLoaded) and event.engine == self.label:
            self.version = max(self.version, event.version)


async def served_engine_client(
    stack: contextlib.AsyncExitStack, recipe: Recipe, env: ActorEnv
) -> tuple[Engine, ChatTokenizer]:
    """A client of the engine role's server, closed with ``stack``; it retries a refused connection
    for about half a minute (a restarted engine process comes back on the same port)."""
    from stacx.inference.sglang_client import SGLangEngine

    _, tokenizer = await open_tokenizer(recipe.model.path)
    client = SGLangEngine(env.engine_url, retries=8, grammars=True)  # our server reads them
    stack.push_async_callback(client.close)
    return client, tokenizer


@contextlib.asynccontextmanager
async def engine(recipe: Recipe, env: ActorEnv, index: int) -> AsyncIterator[list[Actor]]:
    """The student engine as a role (``processes`` placement): the torch engine behind its HTTP
    server, kept on the newest weights; no agent, no sandbox: nothing ever forks this CUDA process.
    """
    from urllib.parse import urlsplit

    from aiohttp import web

    from stacx.inference.server import Server
    from stacx.inference.torch_engine import TorchEngine

    if not env.engine_url:
        raise ConfigError("the engine role needs its URL (placement.mode = 'processes')")
    async with contextlib.AsyncExitStack() as stack:
        student, _ = await student_engine(stack, recipe, env)
        assert isinstance(student, TorchEngine)
        label = f"engine-{index}"
        if student.weight_version > 0:  # started on a durable version (a restart): say so, as
            # WeightSync would have, so that rollout workers waiting on it (ServedVersion) see it
            await env.emit(
                WeightsLoaded(
                    run_id=env.run_id,
                    event_id=derive_id(env.run_id, "WeightsLoaded", label, student.weight_version),
                    version=student.weight_version,
                    engine=label,
                    transport="file",
                )
            )
        runner = web.AppRunner(Server(student, model_name=recipe.model.path).app, access_log=None)
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        url = urlsplit(env.engine_url)
        await web.TCPSite(runner, url.hostname, url.port).start()
        yield [WeightSync(student, label=label, handoff=env.handoff)]


async def student_engine(
    stack: contextlib.AsyncExitStack, recipe: Recipe, env: ActorEnv
) -> tuple[Engine, ChatTokenizer]:
    """The recipe's student engine (closed with `stack`), its memory split checked first; a resumed
    run's engine starts on the newest durable weights."""
    e = recipe.engine
    engine, tokenizer = await open_engine(
        stack,
        backend=e.backend,
        model=recipe.model.path,
        device=e.device,
        dtype=recipe.model.dtype,
        url=e.url,
        max_batch=e.max_batch,
        max_len=e.max_len,
        tp=e.tp,
        mem_fraction=e.mem_fraction,
        log_dir=Path(env.run_dir),
        lora=None if recipe.is_eval else recipe.trainer.lora,
        kv_cache=e.kv_cache,
        cache_bytes=memory.cache_bytes(recipe),
    )
    memory.check_recipe_split(recipe, engine)
    latest = (await env.query(NEWEST_DURABLE_SQL)).to_pylist()
    if latest:
        await load_published(engine, str(latest[0]["path"]), int(latest[0]["version"]))
    return engine, tokenizer


def imitation_workers(
    recipe: Recipe,
    env: ActorEnv,
    envs: Environments,
    chat: ChatFormat,
    student: EnginePolicy,
    teacher_engine: Engine,
    serves: Callable[[], int],
) -> list[Actor]:
    """DAgger's and AggreVaTe's roll-in manager (a beta-mixture of student and teacher), and
    AggreVaTe's branch actor."""
    imitation = recipe.algorithm.imitation
    teacher_policy = EnginePolicy(teacher_engine, TurnActor.TEACHER)
    roll_in = MixtureRollIn(student, teacher_policy, imitation, env.run_id)
    manager = MixtureWorker(
        roll_in=roll_in,
        config=rollout_config(recipe),
        envs=envs,
        chat=chat,
        agent=agent_config(recipe),
        serves=serves,
    )
    workers: list[Actor] = [manager]
    if recipe.algorithm.algo.branches:
        from stacx.imitation.aggrevate import BranchActor

        workers.append(
            BranchActor(
                config=imitation,
                agent=agent_config(recipe),
                envs=envs,
                chat=chat,
                make_learner=lambda _i: student,
                make_teacher=lambda: teacher_policy,
                teacher_temperature=recipe.teacher.temperature,
            )
        )
    return workers


def docker_environments(
    recipe: Recipe, env: ActorEnv
) -> contextlib.AbstractAsyncContextManager[Environments]:
    """The rollout worker's environments: Docker (warm pool, image aliases) or process sandboxes.
    Docker is imported only here."""
    if recipe.sandbox.backend == "process":
        from stacx.sandbox.process_environments import ProcessEnvironments

        return ProcessEnvironments(run_id=env.run_id, emit=env.emit)
    if recipe.sandbox.backend == "remote":
        from stacx.sandbox.remote import RemoteEnvironments, remote_url
        from stacx.sandbox.remote_wire import run_token

        return RemoteEnvironments(
            url=remote_url(recipe.sandbox.url),
            run_id=env.run_id,
            token=run_token(env.run_id, env.run_dir),
            emit=env.emit,
            warm=recipe.sandbox.warm,
        )
    from stacx.sandbox.aliases import AliasMap
    from stacx.sandbox.environments import DockerEnvironments

    return DockerEnvironments(
        run_id=env.run_id,
        emit=env.emit,
        warm=recipe.sandbox.warm,
        aliases=AliasMap.from_env(recipe.sandbox.aliases or None),
        artifacts_dir=Path(env.run_dir) / "artifacts",  # task.toml `artifacts` land here
        runtime=recipe.sandbox.runtime,
    )


@contextlib.asynccontextmanager
async def teacher(recipe: Recipe, env: ActorEnv, index: int) -> AsyncIterator[list[Actor]]:
    """The frozen teacher: DAgger labels (dagger, aggrevate roll-ins) or OPD scores."""
    from stacx.imitation.teacher import TeacherActor

    async with contextlib.AsyncExitStack() as stack:
        engine, tokenizer = await open_teacher_engine(stack, recipe, env)
        # the student's format: a label ends where its reply would (retool's: at its turn's end)
        chat = ChatFormat(tokenizer)
        python = recipe.agent.name in PYTHON_AGENTS
        stop = (
            chat.stop_token_ids if python else get_format(recipe.agent.format).stop_token_ids(chat)
        )
        kind = recipe.algorithm.algo.teacher
        label, score = kind == Teacher.LABEL, kind == Teacher.SCORE
        yield [TeacherActor(engine, recipe.teacher, stop_token_ids=stop, label=label, score=score)]


@contextlib.asynccontextmanager
async def trainer(recipe: Recipe, env: ActorEnv, index: int) -> AsyncIterator[list[Actor]]:
    """The trainer actor, configured by the recipe's [trainer] table; with trainer.world_size > 1
    (or trainer.fsdp) it is rank 0 of an FSDP2 group whose other ranks stop with the role."""
    from stacx.train.trainer import Trainer

    memory.enforce_trainer_share(recipe)
    actor = Trainer(recipe.trainer, handoff=env.handoff)
    try:
        yield [actor]
    finally:
        actor.close()

"""Placement: where a role's actors run. One ``Placement`` protocol with three runners (``local``:
asyncio tasks of the launcher; ``processes``: spawned processes of this node; ``ray``: one Ray actor
per role instance), all running the same role builders and spawning through one ``host_instance``
routine. NATS stays the data plane; only SQL goes through the launcher. Limits (ray): actors on
other machines need a reachable ``STACX_NATS_URL``, and role builders must be importable there.
Design: docs/concepts/placement.md
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from stacx.actors.base import Actor, ActorContext, Query, causal_context
from stacx.actors.load import ProcessLoadWatch
from stacx.actors.run import INTERRUPT_GRACE_S, STOP_GRACE_S, RunContext, Spawner
from stacx.bus.client import drain_or_close
from stacx.bus.server import free_port
from stacx.errors import ConfigError
from stacx.events import Emit, Event, stream_name
from stacx.launch.plan import RoleSpec
from stacx.launch.recipe import Recipe
from stacx.launch.resume import pid_alive
from stacx.store.query import QueryService, remote_query

if TYPE_CHECKING:
    from stacx.weights.share import SharedWeights
    from stacx.weights.sync import InProcessWeights

log = logging.getLogger(__name__)


class ActorEnv(msgspec.Struct, frozen=True, kw_only=True):
    """What a role builder may use: the run's id and directory, publish, the log's SQL, and the
    process's weight handoff (None: the file)."""

    run_id: str
    run_dir: str
    emit: Emit
    query: Query
    handoff: InProcessWeights | SharedWeights | None = None
    # placement.mode = "processes": the URL of the run's engine process (the torch engine behind
    # its HTTP server), which rollout workers generate with instead of an engine of their own
    engine_url: str = ""


RoleBuilder = Callable[[Recipe, ActorEnv, int], AbstractAsyncContextManager[list[Actor]]]
"""(recipe, env, instance index) -> an async context manager yielding the role's actors; on
exit it releases what they used (engines, servers, containers)."""


def resolve_builder(path: str) -> RoleBuilder:
    """The function at "module:function"; modules also resolve from the current directory."""
    module, _, name = path.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        fn: RoleBuilder = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"role builder {path!r} cannot be imported: {exc}") from exc
    return fn


class Placement(Protocol):
    """Where the roles' actors run; every runner spawns through ``host_instance``."""

    mode: str

    async def start(self, role: RoleSpec) -> None:
        """Build and start every instance of ``role``; return once its actors run."""

    async def check(self) -> None:
        """Raise the error that ended an actor of a started role (strict mode), if any."""

    async def stop(self) -> None:
        """Stop every actor placed (and the run's own), then release what the roles built."""


async def host_instance(
    stack: AsyncExitStack,
    spawner: Spawner,
    builder: RoleBuilder,
    recipe: Recipe,
    env: ActorEnv,
    index: int,
) -> None:
    """Build instance ``index`` of a role (released with ``stack``) and spawn its actors, unshared
    ones numbered ``index * n + k`` as in one process, whichever runner hosts it."""
    actors = await stack.enter_async_context(builder(recipe, env, index))
    per_name = Counter(a.name for a in actors if not a.shared)
    seen: Counter[str] = Counter()
    for actor in actors:
        spawner.spawn(actor, instance=index * per_name[actor.name] + seen[actor.name])
        seen[actor.name] += 1


class LocalPlacement:
    """Every role's actors as supervised asyncio tasks of the launcher (RunContext.spawn)."""

    mode = "local"

    def __init__(self, run: RunContext, recipe: Recipe) -> None:
        self.run = run
        self.recipe = recipe
        self._stack = AsyncExitStack()
        from stacx.weights.sync import InProcessWeights  # torch: only once actors are placed

        self._handoff = InProcessWeights()  # one per process: the trainer's and engines' roles
        self._watch = ProcessLoadWatch(run.emit, run.run_id, "launcher")

    async def start(self, role: RoleSpec) -> None:
        self._watch.start()
        builder = resolve_builder(role.builder)
        env = ActorEnv(
            run_id=self.run.run_id,
            run_dir=str(self.run.run_dir),
            emit=self.run.emit,
            query=self.run.query,
            handoff=self._handoff,
        )
        for index in range(role.count):
            await host_instance(self._stack, self.run.actors, builder, self.recipe, env, index)

    async def check(self) -> None:
        if self.run.crashes:
            raise self.run.crashes[0]

    async def stop(self) -> None:
        await self.run.stop_actors()
        await self._stack.aclose()
        await self._watch.stop()


@contextlib.asynccontextmanager
async def remote_run(
    nats_url: str, run_id: str, run_dir: str, name: str
) -> AsyncIterator[tuple[Spawner, ActorContext]]:
    """What a process other than the launcher's needs to host actors: its NATS connection, SQL
    through the launcher, a ``Spawner`` reading from the stream's head, a context for the builder.
    """
    from stacx.bus.client import Publisher, connect

    nc = await connect(nats_url, name=name)
    js = nc.jetstream(timeout=10.0)
    publisher = Publisher(js, run_id)
    spawner: Spawner | None = None
    try:
        query = remote_query(nc, run_id)

        async def head() -> int:
            return int((await js.stream_info(stream_name(run_id))).state.last_seq)

        start = await head()

        def context() -> ActorContext:  # one per actor: its reads wait for its own writes only
            return causal_context(
                run_id=run_id,
                run_dir=run_dir,
                js=js,
                nc=nc,
                publish=publisher.publish,
                query=query,
                head=head,
                start=start,
            )

        spawner = Spawner(context)
        yield spawner, context()
    finally:
        await publisher.close()
        await drain_or_close(nc, drain=spawner is None or not spawner.cancelled)


class HostSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What a process other than the launcher's needs to host one role instance."""

    recipe_json: bytes
    builder: str
    index: int
    nats_url: str
    run_id: str
    run_dir: str
    sys_path: list[str]
    role: str = ""
    engine_url: str = ""  # the run's served engine, for rollout workers (ActorEnv.engine_url)


def host_specs(
    run: RunContext, recipe: Recipe, role: RoleSpec, engine_url: str = ""
) -> list[HostSpec]:
    """One spec per instance of `role`, for the hosts (Ray actors, processes) that serve them."""
    recipe_json = msgspec.json.encode(recipe)
    return [
        HostSpec(
            recipe_json=recipe_json,
            builder=role.builder,
            index=index,
            nats_url=run.nats_url,
            run_id=run.run_id,
            run_dir=str(run.run_dir),
            sys_path=list(sys.path),
            role=role.name,
            engine_url=engine_url,
        )
        for index in range(role.count)
    ]


async def query_service(run: RunContext) -> QueryService:
    """The run's started QueryService: the log's queries answered for roles in other processes."""
    assert run.nc is not None
    service = QueryService(run.nc, run.run_id, run.query)
    await service.start()
    return service


async def serve_role(
    spec: HostSpec, ready: Callable[[], None], stop: asyncio.Event, hurry: asyncio.Event
) -> None:
    """Every role host outside the launcher: build one instance, run its actors and publish its load
    until ``stop``, stop them (``hurry`` set: the run was interrupted, in-flight work is cancelled
    after `INTERRUPT_GRACE_S`), then raise an actor's programming error (strict mode)."""
    for p in reversed(spec.sys_path):
        if p not in sys.path:
            sys.path.insert(0, p)
    recipe = msgspec.json.decode(spec.recipe_json, type=Recipe)
    name = f"stacx-host-{spec.run_id}-{spec.role or spec.builder}-{spec.index}"
    async with AsyncExitStack() as stack:
        spawner, own = await stack.enter_async_context(
            remote_run(spec.nats_url, spec.run_id, spec.run_dir, name)
        )

        async def emit(event: Event) -> None:
            await own.publish(event)

        from stacx.weights.share import SharedWeights  # torch: in the host only

        handoff = SharedWeights()  # the trainer's versions to engines in other hosts
        stack.callback(handoff.close)
        env = ActorEnv(
            run_id=spec.run_id,
            run_dir=spec.run_dir,
            emit=emit,
            query=own.query,
            handoff=handoff,
            engine_url=spec.engine_url,
        )
        builder = resolve_builder(spec.builder)
        await host_instance(stack, spawner, builder, recipe, env, spec.index)
        watch = ProcessLoadWatch(emit, spec.run_id, f"{spec.role or 'role'}-{spec.index}")
        stack.push_async_callback(watch.stop)
        watch.start()
        ready()
        await stop.wait()
        await spawner.stop(INTERRUPT_GRACE_S if hurry.is_set() else STOP_GRACE_S)
        if spawner.crashes:  # strict mode: an actor died of a programming error
            raise spawner.crashes[0]


class RoleHost:
    """The body of a Ray actor: builds one role instance and runs its actors until stopped."""

    def __init__(self) -> None:
        self._stop = asyncio.Event()
        self._hurry = asyncio.Event()
        self._ready = asyncio.Event()

    async def serve(self, spec_json: bytes) -> str:
        spec = msgspec.json.decode(spec_json, type=HostSpec)
        await serve_role(spec, self._ready.set, self._stop, self._hurry)
        return f"{spec.builder}[{spec.index}] stopped"

    async def ready(self) -> bool:
        await self._ready.wait()
        return True

    def pid(self) -> int:
        return os.getpid()

    def address(self) -> str:
        """A URL on this actor's node for the engine role to serve on: rollout workers on any node
        of the cluster reach it."""
        import ray

        return f"http://{ray.util.get_node_ip_address()}:{free_port()}"

    async def stop(self, hurry: bool = False) -> None:
        if hurry:
            self._hurry.set()
        self._stop.set()


async def _reaped(pids: list[int], timeout_s: float = 10.0) -> None:
    """Wait until these processes are gone (Ray's shutdown ends its workers asynchronously);
    SIGKILL those still there after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    left = list(pids)
    while left:
        left = [p for p in left if pid_alive(p)]
        if not left:
            return
        if time.monotonic() >= deadline:
            log.warning(
                "ray worker(s) %s still running %.0f s after shutdown; killed", left, timeout_s
            )
            for p in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
            return
        await asyncio.sleep(0.1)


class RayPlacement:
    """Each role instance in a Ray actor with the role's ``num_cpus``/``num_gpus``."""

    mode = "ray"

    def __init__(self, run: RunContext, recipe: Recipe) -> None:
        self.run = run
        self.recipe = recipe
        self.service: QueryService | None = None
        self._hosts: list[tuple[Any, Any]] = []  # (ray actor handle, serve() ObjectRef)
        self._pids: list[int] = []  # the hosts' worker processes (this node: Ray started here)
        self._started_ray = False
        self.engine_url = ""  # the engine role's, on its node; the rollout workers' server

    async def _init(self) -> None:
        import ray

        if self.service is None:
            self.service = await query_service(self.run)
        if not ray.is_initialized():
            p = self.recipe.placement
            kwargs: dict[str, object] = {"include_dashboard": False, "log_to_driver": True}
            if p.ray_address:
                kwargs["address"] = p.ray_address
            elif p.ray_num_cpus is not None:
                kwargs["num_cpus"] = p.ray_num_cpus
            await asyncio.to_thread(lambda: ray.init(**kwargs))  # type: ignore[arg-type]
            self._started_ray = True

    async def start(self, role: RoleSpec) -> None:
        import ray

        await self._init()
        resolve_builder(role.builder)  # fail here, with the path, rather than inside Ray
        remote_cls = ray.remote(RoleHost)
        for spec in host_specs(self.run, self.recipe, role, self.engine_url):
            host: Any = remote_cls.options(  # type: ignore[attr-defined]
                num_cpus=role.resources.cpus,
                num_gpus=role.resources.gpus,
                name=f"stacx-{self.run.run_id}-{role.name}-{spec.index}",
            ).remote()
            if role.name == "engine" and not self.engine_url:  # started before the rollout role
                self.engine_url = await asyncio.to_thread(ray.get, host.address.remote())
                spec = msgspec.structs.replace(spec, engine_url=self.engine_url)
            ref = host.serve.remote(msgspec.json.encode(spec))
            self._hosts.append((host, ref))
            if self._started_ray:
                self._pids.append(await asyncio.to_thread(ray.get, host.pid.remote()))
            ready = host.ready.remote()
            done, _ = await asyncio.to_thread(ray.wait, [ready, ref], num_returns=1)
            if ref in done:  # serve() returned or raised before the actors were up
                await asyncio.to_thread(ray.get, ref)

    async def check(self) -> None:
        """Raise if a Ray actor's serve() ended while the run is live, or a launcher actor (the
        scheduler) died of a programming error."""
        import ray

        if self.run.crashes:
            raise self.run.crashes[0]
        refs = [ref for _h, ref in self._hosts]
        if refs:
            done, _ = await asyncio.to_thread(ray.wait, refs, num_returns=len(refs), timeout=0)
            for ref in done:
                await asyncio.to_thread(ray.get, ref)

    async def stop(self) -> None:
        import ray

        hurry = self.run.stop_grace_s < STOP_GRACE_S
        for host, _ref in self._hosts:
            with contextlib.suppress(Exception):
                host.stop.remote(hurry)  # type: ignore[attr-defined]
        for host, ref in self._hosts:
            try:
                await asyncio.to_thread(ray.get, ref, timeout=60)
            except Exception as exc:  # a crashed or hung host: reported, then killed
                log.warning("ray role host ended badly: %r", exc)
            with contextlib.suppress(Exception):
                ray.kill(host)
        self._hosts.clear()
        if self.service is not None:
            await self.service.stop()
        if self._started_ray:
            await asyncio.to_thread(ray.shutdown)
            await _reaped(self._pids)  # the cluster it started ends with the run, workers too
            self._pids.clear()
        await self.run.stop_actors()

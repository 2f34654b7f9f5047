"""Placement: where a role's actors run. ``local``: asyncio tasks in the launcher's process.
``ray``: one Ray actor per role instance, with the role's CPU/GPU request, running the SAME
role builder and actor code.

NATS stays the data plane either way: a Ray actor connects to the run's NATS URL, publishes
with its own Publisher and consumes through its own durable consumers; only SQL goes through
the launcher (``stacx.store.query``), because the recorder, the log's only writer, lives there.

Limits: the embedded NATS server listens on loopback, so Ray actors on *other* machines need
``STACX_NATS_URL`` pointing at a server they can reach (a local Ray cluster works as is).
Role builders are found by dotted path (``module:function``), so they must be importable in
the Ray workers (the launcher passes its ``sys.path`` along).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import sys
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import TYPE_CHECKING, Any

import msgspec

from stacx.actors.base import Actor, ActorContext, Query, Supervisor, causal_context
from stacx.actors.run import RunContext
from stacx.errors import ConfigError
from stacx.events import Emit, Event, stream_name
from stacx.launch.plan import RoleSpec
from stacx.launch.recipe import Recipe
from stacx.store.query import QueryService, remote_query

if TYPE_CHECKING:
    from stacx.weights.share import SharedWeights
    from stacx.weights.sync import InProcessWeights

log = logging.getLogger(__name__)


class ActorEnv(msgspec.Struct, frozen=True, kw_only=True):
    """What a role builder may use: the run's id and directory, publish, the log's SQL, and
    the process's weight handoff: in memory for local placement, across the node's processes
    (CUDA IPC / shared memory, stacx.weights.share) in a Ray actor; None: the file."""

    run_id: str
    run_dir: str
    emit: Emit
    query: Query
    handoff: InProcessWeights | SharedWeights | None = None


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


class LocalPlacement:
    """Every role's actors as supervised asyncio tasks of the launcher (RunContext.spawn)."""

    mode = "local"

    def __init__(self, run: RunContext, recipe: Recipe) -> None:
        self.run = run
        self.recipe = recipe
        self._stack = AsyncExitStack()
        from stacx.weights.sync import InProcessWeights  # torch: only once actors are placed

        self._handoff = InProcessWeights()  # one per process: the trainer's and engines' roles

    async def start(self, role: RoleSpec) -> None:
        builder = resolve_builder(role.builder)
        env = ActorEnv(
            run_id=self.run.run_id,
            run_dir=str(self.run.run_dir),
            emit=self.run.emit,
            query=self.run.query,
            handoff=self._handoff,
        )
        for index in range(role.count):
            for actor in await self._stack.enter_async_context(builder(self.recipe, env, index)):
                self.run.spawn(actor)

    async def stop(self) -> None:
        await self.run.stop_actors()
        await self._stack.aclose()


class RoleHost:
    """The body of a Ray actor: builds one role instance and runs its actors until stopped."""

    def __init__(self) -> None:
        self._stop = asyncio.Event()
        self._ready = asyncio.Event()

    async def serve(
        self,
        recipe_json: bytes,
        builder_path: str,
        index: int,
        nats_url: str,
        run_id: str,
        run_dir: str,
        sys_path: list[str],
    ) -> str:
        from stacx.bus.client import Publisher, connect

        for p in reversed(sys_path):
            if p not in sys.path:
                sys.path.insert(0, p)
        recipe = msgspec.json.decode(recipe_json, type=Recipe)
        nc = await connect(nats_url, name=f"stacx-ray-{run_id}-{builder_path}-{index}")
        js = nc.jetstream(timeout=10.0)
        publisher = Publisher(js, run_id)
        query = remote_query(nc, run_id)

        async def head() -> int:
            return int((await js.stream_info(stream_name(run_id))).state.last_seq)

        start = await head()  # what this host must see from the start (a resumed run's log)

        def context() -> ActorContext:  # one per actor: its reads wait for its own writes only
            return causal_context(
                run_id=run_id,
                run_dir=run_dir,
                js=js,
                publish=publisher.publish,
                query=query,
                head=head,
                start=start,
            )

        builder_ctx = context()

        async def emit(event: Event) -> None:
            await builder_ctx.publish(event)

        from stacx.weights.share import SharedWeights  # torch: in the host only

        handoff = SharedWeights()  # the trainer's versions to engines in other hosts of the node
        env = ActorEnv(
            run_id=run_id, run_dir=run_dir, emit=emit, query=builder_ctx.query, handoff=handoff
        )
        try:
            async with resolve_builder(builder_path)(recipe, env, index) as actors:
                sups: list[Supervisor] = []
                tasks = []
                per_name = Counter(a.name for a in actors if not a.shared)
                seen: Counter[str] = Counter()
                for actor in actors:
                    # numbered as local placement numbers them (builder `index` yields
                    # per_name[name] instances of each name), so consumers match across modes
                    instance = (
                        0 if actor.shared else index * per_name[actor.name] + seen[actor.name]
                    )
                    seen[actor.name] += 1
                    actor.bind(context(), instance=instance)
                    sup = Supervisor(actor)
                    sups.append(sup)
                    tasks.append(asyncio.create_task(sup.run(), name=f"actor:{actor.name}"))
                self._ready.set()
                await self._stop.wait()
                for s in sups:
                    s.stop.set()
                _done, pending = await asyncio.wait(tasks, timeout=30) if tasks else (set(), set())
                for t in pending:
                    t.cancel()
                results = await asyncio.gather(*tasks, return_exceptions=True)
                crashes = [r for r in results if isinstance(r, Exception)]
                if crashes:  # strict mode: an actor died of a programming error
                    raise crashes[0]
        finally:
            handoff.close()
            await publisher.close()
            with contextlib.suppress(Exception):
                await nc.drain()
        return f"{builder_path}[{index}] stopped"

    async def ready(self) -> bool:
        await self._ready.wait()
        return True

    async def stop(self) -> None:
        self._stop.set()


class RayPlacement:
    """Each role instance in a Ray actor with the role's ``num_cpus``/``num_gpus``."""

    mode = "ray"

    def __init__(self, run: RunContext, recipe: Recipe) -> None:
        self.run = run
        self.recipe = recipe
        self.service: QueryService | None = None
        self._hosts: list[tuple[Any, Any]] = []  # (ray actor handle, serve() ObjectRef)
        self._started_ray = False

    async def _init(self) -> None:
        import ray

        if self.service is None:
            assert self.run.nc is not None
            self.service = QueryService(self.run.nc, self.run.run_id, self.run.query)
            await self.service.start()
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
        recipe_json = msgspec.json.encode(self.recipe)
        for index in range(role.count):
            host: Any = remote_cls.options(  # type: ignore[attr-defined]
                num_cpus=role.resources.cpus,
                num_gpus=role.resources.gpus,
                name=f"stacx-{self.run.run_id}-{role.name}-{index}",
            ).remote()
            ref = host.serve.remote(
                recipe_json,
                role.builder,
                index,
                self.run.nats_url,
                self.run.run_id,
                str(self.run.run_dir),
                list(sys.path),
            )
            self._hosts.append((host, ref))
            ready = host.ready.remote()
            done, _ = await asyncio.to_thread(ray.wait, [ready, ref], num_returns=1)
            if ref in done:  # serve() returned or raised before the actors were up
                await asyncio.to_thread(ray.get, ref)

    async def check(self) -> None:
        """Raise if a Ray actor's serve() ended (crashed) while the run is live."""
        import ray

        refs = [ref for _h, ref in self._hosts]
        if refs:
            done, _ = await asyncio.to_thread(ray.wait, refs, num_returns=len(refs), timeout=0)
            for ref in done:
                await asyncio.to_thread(ray.get, ref)

    async def stop(self) -> None:
        import ray

        for host, _ref in self._hosts:
            with contextlib.suppress(Exception):
                host.stop.remote()  # type: ignore[attr-defined]
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
        await self.run.stop_actors()


Placement = LocalPlacement | RayPlacement


def make_placement(run: RunContext, recipe: Recipe) -> Placement:
    return (
        RayPlacement(run, recipe) if recipe.placement.mode == "ray" else LocalPlacement(run, recipe)
    )

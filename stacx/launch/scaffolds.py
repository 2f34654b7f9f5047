"""Wiring of an installed scaffold's rollout: the model gateway over the rollout worker's engine on
a unix socket, Docker environments that layer the scaffold over each task image (network none, the
socket's directory mounted) and, for a spec with `beside`, a container of its own per episode plus
the exec relay. The sockets live in a short private temp directory (a socket path is limited to 107
bytes), removed when the worker exits.
Design: docs/scaffolds.md
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator

from stacx.agents.exec_relay import ExecRelay
from stacx.agents.installed import SOCKET, SOCKET_DIR, InstalledConfig, installed_agents
from stacx.agents.scaffold_spec import ScaffoldSpec
from stacx.inference.gateway import Gateway, serve_unix
from stacx.launch.placement import ActorEnv
from stacx.launch.recipe import Recipe, scaffold_of
from stacx.ports import (
    ChatTokenizer,
    Engine,
    Environments,
    InfraFailure,
    Limits,
    MakeAgent,
    Sandbox,
)

RELAY_SOCKET = "exec.sock"  # beside the gateway's socket, in the same mounted directory
MODEL_NAME = "student"  # what the scaffold asks for (`openai/student`); the gateway serves one


@contextlib.asynccontextmanager
async def installed_rollout(
    recipe: Recipe, env: ActorEnv, engine: Engine, tokenizer: ChatTokenizer
) -> AsyncIterator[tuple[Environments, MakeAgent]]:
    """The environments and agent factory of an `agent.name = "installed"` rollout worker."""
    from stacx.sandbox.aliases import AliasMap
    from stacx.sandbox.environments import DockerEnvironments
    from stacx.sandbox.layers import ImageLayer

    a = recipe.agent
    spec = scaffold_of(a)
    gateway = Gateway(
        engine,
        tokenizer,
        model_name=MODEL_NAME,
        aliases=(recipe.model.path,),  # a scaffold may also name the recipe's model
        max_len=min(recipe.engine.max_len, recipe.agent.context_budget),
        default_max_tokens=recipe.agent.max_new_tokens,
        require_episode=True,
    )
    host_dir = tempfile.mkdtemp(prefix="stacx-gw-")
    os.chmod(host_dir, 0o755)
    # read-only: a socket still connects, and no episode's container can replace the socket
    # that every episode of the run reaches the gateway by
    ro = {host_dir: f"{SOCKET_DIR}:ro"}
    layer = ImageLayer(name=spec.name, run=spec.layer_commands(), mounts=ro)
    try:
        async with (
            serve_unix(gateway, os.path.join(host_dir, os.path.basename(SOCKET))),
            DockerEnvironments(
                run_id=env.run_id,
                emit=env.emit,
                warm=recipe.sandbox.warm,
                aliases=AliasMap.from_env(recipe.sandbox.aliases or None),
                layer=layer,
            ) as envs,
            DockerBeside(spec, env, ro) as beside,
        ):
            await beside.serve(os.path.join(host_dir, RELAY_SOCKET))
            config = InstalledConfig(
                max_turns=a.max_turns,
                max_new_tokens=a.max_new_tokens,
                temperature=a.temperature,
                top_p=a.top_p,
                timeout_s=a.episode_timeout_s,
            )
            yield envs, installed_agents(spec, gateway, config, beside if spec.beside else None)
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)


class DockerBeside:
    """The per-episode containers of a `beside` scaffold and the exec relay into the task sandboxes;
    the image is built on first use. Does nothing for a spec without `beside`."""

    def __init__(self, spec: ScaffoldSpec, env: ActorEnv, mounts: dict[str, str]) -> None:
        self.spec, self.env, self.mounts = spec, env, mounts
        self.relay = ExecRelay()
        self._stack = contextlib.AsyncExitStack()
        self._image: str | None = None
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> DockerBeside:
        if self.spec.beside is not None:
            import aiodocker

            from stacx.sandbox.pool import SandboxPool

            self._docker = await self._stack.enter_async_context(aiodocker.Docker())
            self._pool = SandboxPool(
                size=0, run_id=self.env.run_id, emit=self.env.emit, docker=self._docker
            )
            self._stack.push_async_callback(self._pool.close)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def serve(self, path: str) -> None:
        if self.spec.beside is not None:
            await self._stack.enter_async_context(self.relay.serve(path))

    @contextlib.asynccontextmanager
    async def sandbox(self, episode_id: str) -> AsyncIterator[Sandbox]:
        from stacx.errors import SandboxError, TaskError
        from stacx.events import FailureKind

        try:
            image = await self._built()
        except TaskError as exc:
            raise InfraFailure(FailureKind.IMAGE_BUILD, str(exc)) from exc
        limits = Limits(allow_internet=False, mounts=self.mounts)
        try:
            own = await self._pool.acquire(image, limits, episode_id=episode_id)
        except SandboxError as exc:
            raise InfraFailure(FailureKind.START, str(exc)) from exc
        try:
            yield own
        finally:
            await self._pool.release(own, reason="scaffold done")

    async def _built(self) -> str:
        from stacx.sandbox.images import ensure_base
        from stacx.sandbox.layers import ImageLayer, layered_image

        assert self.spec.beside is not None
        base = self.spec.beside.base_image
        async with self._lock:
            if self._image is None:
                # STACX's own offline base: built here when missing, as for any task (the
                # alias map never depends on which bases exist)
                await asyncio.to_thread(ensure_base, base)
                layer = ImageLayer(name=f"{self.spec.name}-beside", run=self.spec.beside_commands())
                self._image = await layered_image(self._docker, base, layer)
        return self._image

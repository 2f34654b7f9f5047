"""Wiring of an installed scaffold's rollout: the model gateway over the rollout worker's engine,
served on a unix socket; Docker environments that layer the scaffold over each task image, with
network none and that socket's directory mounted; the scaffold's agent factory.

The socket lives in a short private directory under the system temp dir (a unix socket path is
limited to 107 bytes, run directories can be longer), removed when the rollout worker exits.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from typing import cast

from stacx.agents.chat import ChatTokenizer
from stacx.agents.installed import SOCKET, SOCKET_DIR, InstalledConfig, installed_agents, scaffold
from stacx.inference.gateway import Gateway, TemplateTokenizer, serve_unix
from stacx.launch.placement import ActorEnv
from stacx.launch.recipe import Recipe
from stacx.ports import Engine, Environments, MakeAgent

MODEL_NAME = "student"  # what the scaffold asks for (`openai/student`); the gateway serves one


def installed_config(recipe: Recipe) -> InstalledConfig:
    a = recipe.agent
    return InstalledConfig(
        max_turns=a.max_turns,
        max_new_tokens=a.max_new_tokens,
        temperature=a.temperature,
        top_p=a.top_p,
        timeout_s=a.episode_timeout_s,
    )


@contextlib.asynccontextmanager
async def installed_rollout(
    recipe: Recipe, env: ActorEnv, engine: Engine, tokenizer: ChatTokenizer
) -> AsyncIterator[tuple[Environments, MakeAgent]]:
    """The environments and agent factory of an `agent.name = "installed"` rollout worker."""
    from stacx.sandbox.aliases import AliasMap
    from stacx.sandbox.environments import DockerEnvironments
    from stacx.sandbox.layers import ImageLayer

    spec = scaffold(recipe.agent.scaffold)
    gateway = Gateway(
        engine,
        cast(TemplateTokenizer, tokenizer),  # an HF tokenizer is both
        model_name=MODEL_NAME,
        aliases=(recipe.model.path,),  # a scaffold may also name the recipe's model
        max_len=min(recipe.engine.max_len, recipe.agent.context_budget),
        default_max_tokens=recipe.agent.max_new_tokens,
        require_episode=True,
    )
    host_dir = tempfile.mkdtemp(prefix="stacx-gw-")
    os.chmod(host_dir, 0o755)
    # read-only: a socket still connects, and no episode's container can replace the socket
    # every episode of the run reaches the gateway by
    ro = {host_dir: f"{SOCKET_DIR}:ro"}
    layer = ImageLayer(name=spec.name, run=spec.layer_commands(), mounts=ro)
    try:
        async with serve_unix(gateway, os.path.join(host_dir, os.path.basename(SOCKET))):
            async with DockerEnvironments(
                run_id=env.run_id,
                emit=env.emit,
                warm=recipe.sandbox.warm,
                aliases=AliasMap.from_env(recipe.sandbox.aliases or None),
                layer=layer,
            ) as envs:
                yield envs, installed_agents(spec, gateway, installed_config(recipe))
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)


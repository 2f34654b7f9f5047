"""The sandbox limits a task asks for: its task.toml read into the `Limits` port that every
backend (Docker, process, remote) enforces. Here, in the environment engine, so that the Harbor
task format (stacx.harbor) stays below the ports and knows nothing of sandboxes."""

from __future__ import annotations

from stacx.harbor.task_network import network_mode
from stacx.harbor.tasks import resolve_env
from stacx.ports import Limits, Task


def task_limits(task: Task, *, pids: int = 1024) -> Limits:
    """The sandbox limits a task asks for (STACX adds the pids limit). Not applied: gpus and
    gpu_types (this backend gives none); storage_mb applies only where quotas are enabled."""
    env = task.config.environment
    return Limits(
        cpus=env.cpus,
        memory_mb=env.memory_mb,
        pids=pids,
        # the agent's phase decides how the sandbox starts (stacx.sandbox.environments
        # switches it for a verifier phase with another policy)
        allow_internet=network_mode(task, "agent") == "public",
        storage_mb=env.storage_mb,
        env=resolve_env(env.env, where=f"{task.path}/task.toml: environment.env"),
        workdir=env.workdir,
        cap_add=env.stacx.cap_add,
        new_privileges=env.stacx.new_privileges,
        read_only_root=env.stacx.read_only_root,
    )

"""Finding and removing STACX sandbox containers (`stacx sandbox ls` / `gc`), with their per-episode
networks and volumes. An orphan was started on this host by a process that is gone (pid not running,
or reused); other hosts' containers are never judged orphans.
"""

from __future__ import annotations

import asyncio
import os
import socket

import aiodocker
import msgspec
from aiodocker.networks import DockerNetwork
from aiodocker.volumes import DockerVolume

from stacx.sandbox.docker import LABEL, delete, process_start_time


class SandboxInfo(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    name: str
    image: str
    state: str
    run_id: str
    episode_id: str
    pid: int | None
    host: str
    alive: bool | None  # None: owned by another host, unknown here


def owner_alive(labels: dict[str, str]) -> bool | None:
    """Whether the owning process still runs (None if it ran on another host)."""
    if labels.get("stacx.host", "") != socket.gethostname():
        return None
    try:
        pid = int(labels.get("stacx.pid", ""))
    except ValueError:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, owned by someone else
    started = labels.get("stacx.pid_start", "")
    return not started or process_start_time(pid) == started


async def list_sandboxes(docker: aiodocker.Docker) -> list[SandboxInfo]:
    """Every container labeled as a STACX sandbox, running or not."""
    containers = await docker.containers.list(all=True, filters={"label": [f"{LABEL}=1"]})
    out = []
    for c in containers:
        raw = c._container
        labels: dict[str, str] = raw.get("Labels") or {}
        pid = labels.get("stacx.pid", "")
        out.append(
            SandboxInfo(
                id=c.id[:12],
                name=(raw.get("Names") or ["?"])[0].lstrip("/"),
                image=str(raw.get("Image", "")),
                state=str(raw.get("State", "")),
                run_id=labels.get("stacx.run_id", ""),
                episode_id=labels.get("stacx.episode_id", ""),
                pid=int(pid) if pid.isdigit() else None,
                host=labels.get("stacx.host", ""),
                alive=owner_alive(labels),
            )
        )
    return out


async def collect_garbage(
    docker: aiodocker.Docker, *, dry_run: bool = False, run_id: str | None = None
) -> list[SandboxInfo]:
    """Remove orphans (`run_id`: that run's sandboxes); what was (`dry_run`: would be) removed."""
    doomed = [
        s
        for s in await list_sandboxes(docker)
        if (s.run_id == run_id if run_id is not None else s.alive is False)
    ]
    if not dry_run:
        containers = docker.containers
        await asyncio.gather(
            *(
                delete(containers.container(s.id).delete(force=True, v=True), 404, 409)
                for s in doomed
            )
        )
        # the per-episode networks and compose volumes, judged as containers are, once their
        # containers are gone (one still in use is left)
        mine = {"label": [f"{LABEL}=1"]}
        for net in await docker.networks.list(filters=mine):
            if _doomed(net.get("Labels") or {}, run_id):
                await delete(DockerNetwork(docker, net["Id"]).delete(), 403, 404, 409)
        for vol in (await docker.volumes.list(filters=mine)).get("Volumes") or []:
            if _doomed(vol.get("Labels") or {}, run_id):
                await delete(DockerVolume(docker, vol["Name"]).delete(), 404, 409)
    return doomed


def _doomed(labels: dict[str, str], run_id: str | None) -> bool:
    return (
        labels.get("stacx.run_id") == run_id if run_id is not None else owner_alive(labels) is False
    )

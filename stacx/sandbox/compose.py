"""A task's docker-compose.yaml run through the Docker API: `main` is the episode's sandbox, every
other service a sidecar on a per-episode internal network, started in ``depends_on`` order. Sidecars
never reach the internet nor the host; named volumes are removed with the episode.

Design: docs/tasks.md#running-a-compose-file
"""

from __future__ import annotations

import asyncio
import graphlib
import time

import aiodocker
from aiodocker.containers import DockerContainer
from aiodocker.networks import DockerNetwork
from aiodocker.types import JSONValue
from aiodocker.volumes import DockerVolume

from stacx.errors import SandboxError, TaskError
from stacx.harbor.compose_load import FILES, MAIN, Mount, Service, compose_file, load_compose
from stacx.sandbox.docker import delete
from stacx.sandbox.privileges import security_options

__all__ = ["FILES", "MAIN", "Mount", "Service", "compose_file", "load_compose"]


def binds(service: Service, volumes: dict[str, str]) -> dict[str, str]:
    """Docker's Binds for the service (source -> target[:ro]), named volumes by Docker name."""
    return {
        (volumes[m.source] if m.volume else m.source): m.target + (":ro" if m.read_only else "")
        for m in service.mounts
    }


def start_order(services: dict[str, Service]) -> list[str]:
    """The sidecars, each after what it depends on (a cycle is a TaskError)."""
    graph = {name: [d for d in s.depends_on if d != MAIN] for name, s in services.items()}
    graph.pop(MAIN, None)
    try:
        return list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        raise TaskError(
            f"docker-compose.yaml: depends_on cycle through {exc.args[1][0]!r}"
        ) from exc


class Sidecars:
    """The running sidecars of one episode and their network; `close()` removes them."""

    def __init__(self, docker: aiodocker.Docker, network: str) -> None:
        self.docker = docker
        self.network = network
        self.containers: dict[str, DockerContainer] = {}

    async def start(
        self,
        service: Service,
        image: str,
        labels: dict[str, str],
        timeout_s: float,
        volumes: dict[str, str] | None = None,
    ) -> None:
        """Start `service` once its dependencies are ready; `volumes`: compose name -> Docker's."""
        for dep, condition in service.depends_on.items():
            await self.wait(dep, condition, timeout_s)
        config: dict[str, JSONValue] = {
            "Image": image,
            "Env": [f"{k}={v}" for k, v in service.environment.items()],
            "Labels": {**labels, "stacx.service": service.name},
            # the same least privilege as `main` (stacx.sandbox.privileges)
            "HostConfig": {"NetworkMode": self.network, "Init": True, **security_options()},
            "NetworkingConfig": {"EndpointsConfig": {self.network: {"Aliases": [service.name]}}},
        }
        if service.mounts:
            config["HostConfig"]["Binds"] = [  # type: ignore[index]
                f"{src}:{dst}" for src, dst in binds(service, volumes or {}).items()
            ]
        for key, value in (
            ("Cmd", service.command),
            ("Entrypoint", service.entrypoint),
            ("Healthcheck", service.healthcheck),
            ("WorkingDir", service.working_dir),
            ("User", service.user),
        ):
            if value is not None:
                config[key] = value  # type: ignore[assignment]
        try:
            container = await self.docker.containers.create(config)
            self.containers[service.name] = container
            await container.start()
        except aiodocker.DockerError as exc:
            raise SandboxError(f"compose service {service.name} ({image}): {exc}") from exc

    async def wait(self, name: str, condition: str, timeout_s: float) -> None:
        """Until service `name` meets `condition` (SandboxError with its log if it cannot)."""
        container = self.containers[name]
        deadline = time.monotonic() + timeout_s
        while True:
            state = (await container.show()).get("State") or {}
            health = (state.get("Health") or {}).get("Status")
            if condition == "service_started" and state.get("Running"):
                return
            if condition == "service_healthy" and health == "healthy":
                return
            if state.get("Status") == "exited":
                if condition == "service_completed_successfully" and state.get("ExitCode") == 0:
                    return
                raise SandboxError(
                    f"compose service {name} exited {state.get('ExitCode')}: "
                    f"{await self._log(container)}"
                )
            if health == "unhealthy" or time.monotonic() > deadline:
                raise SandboxError(
                    f"compose service {name} is not {condition} "
                    f"(health {health}): {await self._log(container)}"
                )
            await asyncio.sleep(0.2)

    async def _log(self, container: DockerContainer) -> str:
        try:
            lines = await container.log(stdout=True, stderr=True, tail=20)
        except aiodocker.DockerError:
            return "(no log)"
        return "".join(lines)[-1500:]

    async def close(self) -> None:
        for container in self.containers.values():
            removal = container.delete(force=True, v=True)
            await delete(removal, 404, what="cannot remove a compose service")
        await remove_network(self.docker, self.network)


async def internal_network(
    docker: aiodocker.Docker, name: str, labels: dict[str, str]
) -> DockerNetwork:
    """A per-episode network whose members reach each other and nothing else."""
    # Internal alone still routes to the host's own addresses (the bridge's gateway IP, where any
    # host service listening on 0.0.0.0 answers); with no IPv4 address on the bridge, nothing.
    return await docker.networks.create(
        {
            "Name": name,
            "Internal": True,
            "Labels": labels,
            "CheckDuplicate": True,
            "Options": {"com.docker.network.bridge.inhibit_ipv4": "true"},
        }
    )


async def remove_network(docker: aiodocker.Docker, name: str) -> None:
    """Remove a per-episode network, detaching what is still on it first; gone already is fine."""
    for attempt in range(20):  # a container being removed can re-appear as an endpoint
        try:
            network = await docker.networks.get(name)
            for container_id in (await network.show()).get("Containers") or {}:
                await delete(network.disconnect({"Container": container_id, "Force": True}), 404)
            await network.delete()
            return
        except aiodocker.DockerError as exc:
            if exc.status == 404:
                return
            if attempt == 19:
                raise SandboxError(f"cannot remove network {name}: {exc}") from exc
            await asyncio.sleep(0.25)


async def create_volumes(
    docker: aiodocker.Docker, services: dict[str, Service], prefix: str, labels: dict[str, str]
) -> dict[str, str]:
    """One Docker volume per named volume (compose name -> `<prefix>-<name>`), with owner labels."""
    made: dict[str, str] = {}
    try:
        for name in sorted({m.source for s in services.values() for m in s.mounts if m.volume}):
            await docker.volumes.create({"Name": f"{prefix}-{name}", "Labels": labels})
            made[name] = f"{prefix}-{name}"
    except aiodocker.DockerError as exc:
        await remove_volumes(docker, list(made.values()))
        raise SandboxError(f"cannot create a compose volume: {exc}") from exc
    return made


async def remove_volumes(docker: aiodocker.Docker, names: list[str]) -> None:
    """Remove an episode's volumes once its containers are gone (retried); gone already is fine."""
    for name in names:
        for attempt in range(20):
            try:
                await DockerVolume(docker, name).delete()
                break
            except aiodocker.DockerError as exc:
                if exc.status == 404:
                    break
                if exc.status != 409 or attempt == 19:
                    raise SandboxError(f"cannot remove volume {name}: {exc}") from exc
                await asyncio.sleep(0.25)

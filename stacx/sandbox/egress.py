"""`network_mode = "allowlist"` on Docker: egress only to the task's `allowed_hosts`.

Per episode, an internal network (no route out, no DNS for outside names) and on it a
sidecar from the base image running the filtering forward proxy (stacx.sandbox.egress_proxy),
itself also on the default bridge. The sandbox joins the internal network for its allowlist
phases and finds the proxy through HTTP_PROXY / HTTPS_PROXY (and the lower-case names), set in
its environment when it starts; NO_PROXY covers localhost only. The network and the sidecar
carry the episode's owner labels (`stacx sandbox gc` removes them once the owner is gone) and
are removed with the episode.

Guarantees: the sandbox has no other way out in an allowlist phase: its only interface besides
loopback is the internal network, whose only reachable peer that forwards is the proxy, which
refuses (403) every host not listed; the host itself is not reachable either (the network's
bridge has no IPv4 address, where a plain internal network routes to the host's addresses). Limits: clients that ignore the proxy variables reach
nothing; the proxy variables stay set in the sandbox's other (no-network) phases, where they
lead nowhere. An allowlist phase next to a public one is refused when the task loads
(stacx.harbor.tasks), as the variables cannot change in a running container.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiodocker
from aiodocker.containers import DockerContainer

from stacx.errors import SandboxError
from stacx.sandbox.compose import remove_network
from stacx.sandbox.egress_proxy import PORT
from stacx.sandbox.images import BASE_IMAGE
from stacx.sandbox.privileges import security_options

ALIAS = "stacx-egress"  # the proxy's name on the internal network
PROXY_SOURCE = Path(__file__).with_name("egress_proxy.py")
READY_TIMEOUT_S = 30.0


def proxy_env() -> dict[str, str]:
    url = f"http://{ALIAS}:{PORT}"
    no_proxy = "localhost,127.0.0.1,::1"
    return {
        "HTTP_PROXY": url,
        "HTTPS_PROXY": url,
        "http_proxy": url,
        "https_proxy": url,
        "NO_PROXY": no_proxy,
        "no_proxy": no_proxy,
    }


class Egress:
    """One episode's internal network and proxy: `await Egress.start(...)`, then `connect` /
    `disconnect` sandboxes by container id; `close()` removes both (idempotent)."""

    def __init__(self, docker: aiodocker.Docker, network: str) -> None:
        self.docker = docker
        self.network = network
        self.proxy: DockerContainer | None = None
        self._closed = False

    @classmethod
    async def start(
        cls, docker: aiodocker.Docker, name: str, hosts: list[str], labels: dict[str, str]
    ) -> Egress:
        egress = cls(docker, name)
        try:
            # Internal alone still routes to the host's own addresses (a service on docker0
            # would answer); with no IPv4 address on the bridge there is nothing to route to.
            await docker.networks.create(
                {
                    "Name": name,
                    "Internal": True,
                    "Labels": labels,
                    "CheckDuplicate": True,
                    "Options": {"com.docker.network.bridge.inhibit_ipv4": "true"},
                }
            )
            egress.proxy = await docker.containers.create(
                {
                    "Image": BASE_IMAGE,
                    "Cmd": ["python3", "-c", PROXY_SOURCE.read_text(), json.dumps(hosts)],
                    "Labels": {**labels, "stacx.service": "egress-proxy"},
                    "HostConfig": {
                        "NetworkMode": "bridge",
                        "Init": True,
                        "Memory": 128 << 20,
                        **security_options(),
                    },
                },
                name=f"{name}-proxy",
            )
            await egress.proxy.start()
            network = await docker.networks.get(name)
            await network.connect(
                {"Container": egress.proxy.id, "EndpointConfig": {"Aliases": [ALIAS]}}
            )
            await egress._ready()
        except BaseException:
            await egress.close()
            raise
        return egress

    async def _ready(self) -> None:
        """Until the proxy prints that it listens (SandboxError with its log if it exits)."""
        assert self.proxy is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            log = "".join(await self.proxy.log(stdout=True, stderr=True))
            if "stacx egress proxy on" in log:
                return
            state = (await self.proxy.show()).get("State") or {}
            if state.get("Status") == "exited" or time.monotonic() > deadline:
                raise SandboxError(f"the egress proxy did not start: {log[-1500:]}")
            await asyncio.sleep(0.1)

    async def connect(self, container_id: str) -> None:
        attached = await self._attached(container_id)
        if "none" in attached:  # an installed scaffold's sandbox: never a route out
            raise SandboxError(f"container {container_id[:12]} was started with network=none")
        if self.network not in attached:
            await (await self.docker.networks.get(self.network)).connect(
                {"Container": container_id}
            )

    async def disconnect(self, container_id: str) -> None:
        if self.network in await self._attached(container_id):
            await (await self.docker.networks.get(self.network)).disconnect(
                {"Container": container_id, "Force": True}
            )

    async def _attached(self, container_id: str) -> dict[str, object]:
        shown = await self.docker.containers.container(container_id).show()
        return shown["NetworkSettings"]["Networks"] or {}

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self.proxy is not None:
                await self.proxy.delete(force=True)
        except aiodocker.DockerError as exc:
            if exc.status != 404:
                raise SandboxError(f"cannot remove the egress proxy: {exc}") from exc
        await remove_network(self.docker, self.network)

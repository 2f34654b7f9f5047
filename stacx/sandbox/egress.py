"""`network_mode = "allowlist"` on Docker: per episode, an internal network and a proxy sidecar
(stacx.sandbox.egress_proxy) that is the sandbox's only way out, to the task's `allowed_hosts`; both
carry owner labels and are removed with the episode.

Design: docs/tasks.md#network-allowlists
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiodocker
from aiodocker.containers import DockerContainer

from stacx.errors import SandboxError
from stacx.sandbox.compose import internal_network, remove_network
from stacx.sandbox.docker import delete
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
    """One episode's network and proxy: `await Egress.start(...)`, `close()`; a sandbox joins
    `network` (DockerSandbox.attach)."""

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
            network = await internal_network(docker, name, labels)
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

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.proxy is not None:
            await delete(self.proxy.delete(force=True), 404, what="cannot remove the egress proxy")
        await remove_network(self.docker, self.network)

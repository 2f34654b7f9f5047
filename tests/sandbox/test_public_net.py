"""A public sandbox reaches the internet but not the host (stacx.sandbox.public_net): a
listener on the host, reachable from Docker's default bridge, is unreachable from a public
sandbox through the network's gateway and through the host's own address, while the package
registry answers (skipped, saying so, where the host itself cannot reach it)."""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Iterator

import aiodocker
import pytest

from stacx.sandbox.docker import DockerSandbox, Limits
from stacx.sandbox.public_net import ENV, NETWORK, RULES

pytestmark = pytest.mark.docker
PUBLIC = Limits(allow_internet=True, memory_mb=256)
REGISTRY = ("pypi.org", 443)


def connect(host: str, port: int) -> str:
    """A command that prints `open` when a TCP connection to host:port succeeds in 3 s."""
    return (
        f"python3 -c \"import socket; socket.create_connection(('{host}', {port}), "
        "timeout=3); print('open')\""
    )


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP listener on every address of the host; its port."""
    server = socket.create_server(("0.0.0.0", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                server.accept()[0].close()
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


def _host_address() -> str:
    route = subprocess.run(
        ["ip", "-4", "route", "get", "1.1.1.1"], capture_output=True, text=True, check=True
    ).stdout.split()
    return route[route.index("src") + 1]


def _iptables_rules(chain: str) -> str:
    return subprocess.run(
        ["iptables", "-S", chain], capture_output=True, text=True, check=True
    ).stdout


async def test_public_sandbox_reaches_the_internet_but_not_the_host(
    base_image: str, docker: aiodocker.Docker, listener: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, "bridge")  # the control: Docker's default bridge reaches the host
    async with await DockerSandbox.create(base_image, PUBLIC, docker=docker, run_id="t") as sb:
        assert (await sb.exec(connect("172.17.0.1", listener), timeout=20)).stdout.strip() == "open"
    monkeypatch.delenv(ENV)
    async with await DockerSandbox.create(base_image, PUBLIC, docker=docker, run_id="t") as sb:
        info = await (await docker.networks.get(NETWORK)).show()
        for host in (info["IPAM"]["Config"][0]["Gateway"], _host_address(), "172.17.0.1"):
            got = await sb.exec(connect(host, listener), timeout=20)
            assert "open" not in got.stdout, f"the host answered at {host}:{listener}"
        try:
            socket.create_connection(REGISTRY, timeout=5).close()
        except OSError as exc:
            pytest.skip(f"the host itself cannot reach {REGISTRY[0]}: {exc}")
        got = await sb.exec(connect(*REGISTRY), timeout=20)
        assert got.stdout.strip() == "open", got
    for chain, *_rule in RULES:  # added once, whatever the number of sandboxes
        listed = _iptables_rules(chain)
        assert listed.count("stacx-public0") == 1, listed

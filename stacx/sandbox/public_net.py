"""`network_mode = "public"` on Docker: the internet but not the host. Public sandboxes join the
`stacx-public` bridge, whose iptables rules (added once) drop packets to the host's own addresses
and to 169.254.0.0/16. Needs root and iptables, else a public sandbox is refused unless
$STACX_PUBLIC_NETWORK names another network (`bridge` reaches the host).

Design: docs/tasks.md#network-allowlists
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import threading

import aiodocker

from stacx.errors import SandboxConfigError, SandboxError

NETWORK = "stacx-public"
BRIDGE = "stacx-public0"
ENV = "STACX_PUBLIC_NETWORK"
RULES = (
    ("INPUT", "-i", BRIDGE, "-m", "conntrack", "!", "--ctstate", "ESTABLISHED,RELATED",
     "-j", "DROP"),
    ("DOCKER-USER", "-i", BRIDGE, "-d", "169.254.0.0/16", "-j", "DROP"),
)  # fmt: skip
_ready: set[str] = set()
_lock = threading.Lock()  # the rules' check-then-insert, across event loops


def public_network() -> str:
    """The network public sandboxes join: $STACX_PUBLIC_NETWORK, else stacx-public."""
    return os.environ.get(ENV) or NETWORK


async def ensure_public_network(docker: aiodocker.Docker) -> str:
    """Create stacx-public and its rules unless present (the rules name the bridge); its name."""
    name = public_network()
    if name != NETWORK:
        return name
    try:
        await docker.networks.get(name)
    except aiodocker.DockerError:
        try:
            await docker.networks.create(
                {
                    # shared by every run: no owner labels, so `stacx sandbox gc` leaves it
                    "Name": name,
                    "CheckDuplicate": True,
                    "Labels": {"stacx.network": "public"},
                    "Options": {"com.docker.network.bridge.name": BRIDGE},
                }
            )
        except aiodocker.DockerError as exc:
            if exc.status != 409:  # another process or episode made it meanwhile
                raise SandboxError(f"cannot create the network {name}: {exc}") from exc
    if not _ready:
        await asyncio.to_thread(install_rules)
    return name


def install_rules() -> None:
    """Add each rule of RULES that iptables does not have yet (first in its chain)."""
    if shutil.which("iptables") is None or os.geteuid() != 0:
        raise SandboxConfigError(
            "a public sandbox must not reach the host, which takes iptables and root here; "
            f"set ${ENV}=bridge to let public sandboxes use Docker's default bridge (which "
            "reaches the host) instead"
        )
    with _lock:
        for chain, *rule in RULES:
            check = ["iptables", "-C", chain, *rule]
            if subprocess.run(check, capture_output=True, check=False).returncode == 0:
                continue
            add = subprocess.run(
                ["iptables", "-I", chain, "1", *rule], capture_output=True, text=True, check=False
            )
            if add.returncode != 0:
                raise SandboxConfigError(
                    f"iptables -I {chain} {' '.join(rule)}: {add.stderr.strip()}"
                )
        _ready.add(BRIDGE)

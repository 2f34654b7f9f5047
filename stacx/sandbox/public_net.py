"""`network_mode = "public"` on Docker: the internet, but not the host.

Public sandboxes (the agent's and the verifier's phases alike) join one bridge network,
`stacx-public`, whose Linux bridge is named `stacx-public0`, made on first use. Two iptables
rules, added once (checked with `iptables -C`, so never twice), keep the host out of reach:

- INPUT: a packet from the bridge addressed to the host itself (the bridge's gateway, every
  address of the host's interfaces) is dropped, unless it answers a connection the host opened;
- DOCKER-USER (the FORWARD hook Docker leaves to users): a packet from the bridge to
  169.254.0.0/16 (link-local: the clouds' metadata service) is dropped.

Everything else is routed as on Docker's default bridge (DNS through Docker's embedded
resolver, inside the container's namespace). Limits: IPv4 only (the network has no IPv6
addresses to reach anything with); other machines of the host's own network stay reachable,
as from any cloud sandbox; needs root and iptables: where they are missing a public sandbox is
refused (SandboxConfigError), unless $STACX_PUBLIC_NETWORK names another network to use as is
(`bridge`: Docker's default, which reaches the host).
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
    """Create stacx-public unless it exists, and its rules unless this process added or found
    them (they name the bridge, so a network made again keeps them); its name."""
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
    with _lock:
        _install_rules()
        _ready.add(BRIDGE)


def _install_rules() -> None:
    if shutil.which("iptables") is None or os.geteuid() != 0:
        raise SandboxConfigError(
            "a public sandbox must not reach the host, which takes iptables and root here; "
            f"set ${ENV}=bridge to let public sandboxes use Docker's default bridge (which "
            "reaches the host) instead"
        )
    for chain, *rule in RULES:
        check = subprocess.run(["iptables", "-C", chain, *rule], capture_output=True, check=False)
        if check.returncode == 0:
            continue
        add = subprocess.run(
            ["iptables", "-I", chain, "1", *rule], capture_output=True, text=True, check=False
        )
        if add.returncode != 0:
            raise SandboxConfigError(f"iptables -I {chain} {' '.join(rule)}: {add.stderr.strip()}")

"""A task's network policy per phase (agent, verifier; each step's too): Harbor 1.4's
network_mode / allowed_hosts, with the deprecated allow_internet, and what "allowlist" can be
combined with on the Docker backend (checked when the task loads)."""

from __future__ import annotations

import re
from pathlib import Path

from stacx.errors import TaskError
from stacx.harbor.compose_load import compose_file
from stacx.harbor.model import Task

# an allowed_hosts entry; the egress proxy (stacx.sandbox.egress_proxy.host_allowed) matches them
_ENTRY = re.compile(r"^(\*\.)?([a-z0-9-]+(\.[a-z0-9-]+)*|\[[0-9a-f:]+\])(:\d{1,5})?$")


def bad_entry(entry: str) -> bool:
    """Whether an allowed_hosts entry is not one of: name, *.name, IP, [IPv6], each :port."""
    return _ENTRY.match(entry.strip().lower()) is None


def network_mode(task: Task, phase: str) -> str:
    """The network policy of `phase`: its own, else [environment]'s, else from allow_internet."""
    env = task.config.environment
    own = task.config.agent if phase == "agent" else task.config.verifier
    if own.network_mode is not None:
        return own.network_mode
    if env.network_mode is not None:
        return env.network_mode
    return "public" if env.allow_internet else "no-network"


def allowed_hosts(task: Task, phase: str) -> list[str]:
    """The hosts an "allowlist" phase may reach: its own if it sets a mode, else [environment]'s."""
    own = task.config.agent if phase == "agent" else task.config.verifier
    if own.network_mode is not None and own.allowed_hosts is not None:
        return list(own.allowed_hosts)
    return list(task.config.environment.allowed_hosts or [])


def episode_network(task: Task) -> tuple[set[str], list[str] | None]:
    """Every phase's (and step's) network mode, and the allowed hosts when one is "allowlist"."""
    modes: set[str] = set()
    hosts: list[str] | None = None
    for view in task.step_tasks or [task]:
        for phase in ("agent", "verifier"):
            mode = network_mode(view, phase)
            modes.add(mode)
            if mode == "allowlist":
                hosts = sorted(set(allowed_hosts(view, phase)))
    return modes, hosts


def check_allowlist(task: Task, where: Path) -> None:
    """What the Docker backend cannot do with "allowlist": refused at load, not run looser."""
    modes, hosts = episode_network(task)
    if hosts is None:
        return
    for view in task.step_tasks or [task]:
        for phase in ("agent", "verifier"):
            if network_mode(view, phase) != "allowlist":
                continue
            mine = sorted(set(allowed_hosts(view, phase)))
            if mine != hosts:
                raise TaskError(
                    f"{where}: network_mode = 'allowlist' with different allowed_hosts in "
                    f"different phases ({mine} and {hosts}) is not supported"
                )
            bad = [h for h in mine if bad_entry(h)]
            if bad:
                raise TaskError(
                    f"{where}: allowed_hosts {bad}: each entry is a host name, '*.' a domain, "
                    "or an IP address, optionally with ':port'"
                )
    if "public" in modes:
        raise TaskError(
            f"{where}: network_mode = 'allowlist' in one phase and 'public' in another is not "
            "supported: the sandbox's proxy settings are fixed when it starts (use 'allowlist' "
            "or 'no-network' for every phase)"
        )
    if compose_file(task.environment_dir) is not None:
        raise TaskError(
            f"{where}: network_mode = 'allowlist' with a docker-compose.yaml is not supported"
        )

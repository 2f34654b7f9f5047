"""Least privilege for every container STACX starts: the HostConfig security keys (every capability
dropped but `DEFAULT_CAPS`, no-new-privileges, the default seccomp profile, never privileged) and
what a task may ask for under [environment.stacx].

Design: docs/sandboxes.md#hardening
"""

from __future__ import annotations

from typing import Any

from stacx.errors import TaskError
from stacx.harbor.model import StacxEnvironment
from stacx.ports import Limits

DEFAULT_CAPS = (
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
)
RUNTIMES = ("runc", "runsc")  # Docker's default, gVisor
# Writable even with a read-only root: Harbor's upload and log paths, and scratch space.
READ_ONLY_WRITABLE = ("/tmp", "/var/tmp", "/run", "/logs", "/tests", "/solution")


def check_runtime(runtime: str, where: str = "sandbox.runtime") -> str:
    if runtime not in RUNTIMES:
        raise TaskError(f"{where} = {runtime!r}: accepted values are {', '.join(RUNTIMES)}")
    return runtime


def requests(limits: Limits | StacxEnvironment) -> list[str]:
    """What a task asks for beyond the default, one phrase each (empty: nothing)."""
    extra = sorted({c.upper().removeprefix("CAP_") for c in limits.cap_add} - set(DEFAULT_CAPS))
    out = [f"cap_add {','.join(extra)}"] if extra else []
    if limits.new_privileges:
        out.append("new_privileges")
    return out


def security_options(limits: Limits | None = None, runtime: str = "runc") -> dict[str, Any]:
    """The HostConfig keys of a hardened container, plus what `limits` declares."""
    limits = limits or Limits()
    caps = sorted({*DEFAULT_CAPS, *(c.upper().removeprefix("CAP_") for c in limits.cap_add)})
    opts: list[Any] = [] if limits.new_privileges else ["no-new-privileges:true"]
    host: dict[str, Any] = {
        "CapDrop": ["ALL"],
        "CapAdd": list(caps),
        "SecurityOpt": opts,  # no seccomp= entry: Docker's default profile applies
        "Privileged": False,
    }
    if runtime != "runc":
        host["Runtime"] = check_runtime(runtime)
    if limits.read_only_root:
        host["ReadonlyRootfs"] = True
    return host


def read_only_mounts() -> list[Any]:
    """Anonymous volumes over `READ_ONLY_WRITABLE` (the archive API writes into them, not tmpfs)."""
    return [{"Type": "volume", "Target": p} for p in READ_ONLY_WRITABLE]

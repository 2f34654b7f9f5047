"""Least privilege for every container STACX starts (task sandboxes, the sandbox service's,
compose services, the egress proxy): the HostConfig security keys, and what a task may ask for.

Default (`security_options`):
- ``CapDrop: ALL``, then ``CapAdd`` of `DEFAULT_CAPS` only. Each kept one was measured as
  needed (leave-one-out on stacx/base with no-new-privileges: apt-get update/install, su,
  setpriv, useradd, chown/chmod of another user's files, killing another user's process),
  and the bundled recipes/tasks/basic oracle and the Harbor fixture tasks pass with the set:
  CHOWN (chown; useradd; dpkg), DAC_OVERRIDE (root reading/writing files and dirs it does not
  own: apt's lists and cache as `_apt`, a task user's files), FOWNER (chmod of another user's
  file), FSETID (keeping setgid/setuid bits set by a task setup), KILL (signalling a process
  of a task user: a timeout's TERM/KILL of its group), SETUID and SETGID (apt drops to `_apt`;
  su, setpriv, gosu, a task's `user`).
  Dropped from Docker's default set: NET_RAW (raw/packet sockets: ARP and ICMP spoofing on
  the bridge), MKNOD (device nodes), SYS_CHROOT, SETPCAP, SETFCAP (file capabilities on new
  binaries), AUDIT_WRITE, and NET_BIND_SERVICE (Docker already lets any user of a container's
  own network namespace bind ports below 1024: ip_unprivileged_port_start=0). None is needed
  by those tasks; a task that needs one declares it.
- ``SecurityOpt``: ``no-new-privileges`` (a setuid binary such as sudo, or a file capability,
  gains nothing: a non-root task user stays unprivileged) and ``seccomp`` left at Docker's
  default profile (never ``unconfined``; the default blocks mount, unshare of user namespaces
  without CAP_SYS_ADMIN, init_module, kexec, ...).
- Docker's default ``ReadonlyPaths``/``MaskedPaths`` (/proc/sysrq-trigger, /proc/kcore, ...)
  are kept (Privileged is never set).

A task asks for more (or less) in its task.toml, a STACX extension (Harbor has no key for it):

    [environment.stacx]
    cap_add = ["NET_RAW"]       # capabilities beyond the default (accepted: stacx.harbor.model.ALL_CAPS)
    new_privileges = true       # setuid binaries work (sudo for a non-root agent user)
    read_only_root = true       # the root filesystem is read-only (less than the default)

`stacx tasks check` lists the tasks that ask for more (`requests`). The OCI runtime
(``sandbox.runtime``, e.g. gVisor's ``runsc``) is the recipe's choice, not the task's.
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
    """The HostConfig keys of a hardened container (see the module); `limits` adds a task's
    declared capabilities, setuid permission and read-only root."""
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
    """Anonymous volumes over `READ_ONLY_WRITABLE` (removed with the container): unlike tmpfs,
    Docker's archive API (uploads of tests and solutions) writes into them."""
    return [{"Type": "volume", "Target": p} for p in READ_ONLY_WRITABLE]

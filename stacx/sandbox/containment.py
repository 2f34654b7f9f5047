"""How the process sandbox contains one host command (stacx.sandbox.process): what this machine
allows (mount and network namespaces, probed once per process), the setup script that binds the
host's top level into a sandbox root and chroots into it, the rlimits applied between fork and
exec, and watching a command's exit without waiting on its pipes.

Limits: as stacx.sandbox.process says, none of this is a security boundary.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from stacx.ports import Limits

log = logging.getLogger(__name__)

Isolation = Literal["namespaces", "rewrite"]
OPEN_FILES = 4096

# Run by `unshare` as (uid 0 of) the new mount namespace: bind the host's top-level dirs into
# the sandbox root, then chroot into it as the command's user. Arguments: root, cwd, userspec,
# "1" to bring loopback up, the dirs to bind (ending with "--"), then the command.
SETUP = r"""
set -e
R=$1 CWD=$2 SPEC=$3 LO=$4; shift 4
while [ "$1" != -- ]; do mount --rbind "/$1" "$R/$1"; shift; done; shift
if [ "$LO" = 1 ]; then ip link set lo up 2>/dev/null || true; fi
exec chroot --userspec="$SPEC" "$R" /bin/sh -c 'cd "$0" && exec "$@"' "$CWD" "$@"
"""


@dataclass(frozen=True)
class Probe:
    isolation: Isolation
    unshare: tuple[str, ...]  # the unshare prefix ("unshare", "--mount", ...), without --net
    net: bool  # a network namespace can be made


_probe: Probe | None = None


def is_root() -> bool:
    return os.geteuid() == 0


def isolation() -> Probe:
    """What this machine allows, probed once per process (a real namespace + chroot run)."""
    global _probe
    if _probe is not None:
        return _probe
    base = ("unshare",) if is_root() else ("unshare", "--user", "--map-root-user")
    ok = shutil.which("unshare") is not None and shutil.which("chroot") is not None
    probe: Probe | None = None
    if ok:
        with tempfile.TemporaryDirectory(prefix="stacx-probe-") as root:
            binds = prepare_root(Path(root), ())
            for net in (True, False):
                argv = [*base, "--mount", *(["--net"] if net else []), "--", "/bin/sh", "-c"]
                argv += [SETUP, "setup", root, "/", "0:0", "0", *binds, "--", "true"]
                if quiet(argv):
                    probe = Probe("namespaces", (*base, "--mount"), net)
                    break
    if probe is None:
        net = ok and quiet([*base, "--net", "--", "true"])
        probe = Probe("rewrite", (*base,) if net else (), net)
        log.warning(
            "process sandbox: no mount namespace here; absolute paths are rewritten in "
            "command lines only (a Harbor verifier cannot run)"
        )
    if not probe.net:
        log.warning("process sandbox: no network namespace here; commands reach the network")
    _probe = probe
    return probe


def quiet(argv: list[str]) -> bool:
    try:
        done = subprocess.run(argv, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def prepare_root(root: Path, mapped: tuple[str, ...]) -> list[str]:
    """Mirror the host's top level in `root`: symlinks copied, dirs made as mountpoints
    (returned, for the setup script to bind), `mapped` names left to the sandbox."""
    binds = []
    for entry in sorted(os.scandir("/"), key=lambda e: e.name):
        target = root / entry.name
        if entry.name in mapped or target.exists() or target.is_symlink():
            continue
        if entry.is_symlink():
            target.symlink_to(os.readlink(entry.path))
        elif entry.is_dir():
            target.mkdir()
            binds.append(entry.name)
    return binds


def live_processes(uid: int) -> list[int]:
    """Pids of `uid`'s processes that are not zombies (from /proc)."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("Uid", "").split()[:1] == [str(uid)] and not fields.get(
            "State", ""
        ).strip().startswith(("Z", "X")):
            pids.append(int(entry.name))
    return pids


def preexec(
    limits: Limits, cpu_seconds: float | None, ids: tuple[int, int] | None
) -> Callable[[], None]:
    """Runs in the child between fork and exec: rlimits, and (rewrite mode) the uid switch."""
    memory = limits.memory_mb << 20
    nproc = limits.pids

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        if cpu_seconds is not None:
            soft = max(int(cpu_seconds + 0.999), 1)
            resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 1))
        if ids is not None:
            os.setgroups([])
            os.setgid(ids[1])
            os.setuid(ids[0])

    return apply


async def exited(proc: asyncio.subprocess.Process) -> int:
    """The command's exit status, as soon as it exits. (`proc.wait()` also waits for its
    pipes to close, which a background child holding them can delay forever.)"""
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:  # already reaped, or no pidfd here: poll the status below
        fd = -1
    if fd >= 0:
        ready: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_reader(fd, readable)
        try:
            await ready
        finally:
            loop.remove_reader(fd)
            os.close(fd)
    # It has exited; the child watcher reaps it and sets the status a moment later (there is
    # no event to wait on for that, short of proc.wait(), which waits for the pipes too).
    while proc.returncode is None:  # noqa: ASYNC110
        await asyncio.sleep(0.005)
    return proc.returncode

"""How the process sandbox contains a command: what this machine allows (namespaces, probed once),
the sandbox root, and the rlimits each command applies to itself. Not a security boundary.

Design: docs/sandboxes.md#the-process-backend
"""

from __future__ import annotations

import functools
import logging
import os
import resource
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from stacx.ports import Limits
from stacx.sandbox.spawner import program
from stacx.sandbox.spawner_main import live_processes

__all__ = ["live_processes"]  # the one /proc scan lives in the spawner's program

log = logging.getLogger(__name__)

Isolation = Literal["namespaces", "rewrite"]
OPEN_FILES = 4096


@dataclass(frozen=True)
class Probe:
    isolation: Isolation
    unshare: tuple[str, ...]  # the unshare prefix ("unshare", "--mount", ...), without --net
    net: bool  # a network namespace can be made


def is_root() -> bool:
    return os.geteuid() == 0


@functools.cache
def isolation() -> Probe:
    """What this machine allows, probed once per process (a real namespace + chroot run)."""
    base = ("unshare",) if is_root() else ("unshare", "--user", "--map-root-user")
    ok = shutil.which("unshare") is not None
    probe: Probe | None = None
    if ok:
        with tempfile.TemporaryDirectory(prefix="stacx-probe-") as root:
            binds = prepare_root(Path(root), ())
            for net in (True, False):
                argv = [*base, "--mount", *(["--net"] if net else []), "--"]
                argv += program("-", root, None, False, binds)  # the spawner's setup, then exit
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
    return probe


def quiet(argv: list[str]) -> bool:
    try:
        done = subprocess.run(argv, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def prepare_root(root: Path, mapped: tuple[str, ...]) -> list[str]:
    """Mirror the host's top level in `root`: symlinks copied, mountpoint dirs made and returned."""
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


def rlimits(limits: Limits, cpu_seconds: float | None) -> list[tuple[int, int, int]]:
    """A command's (resource, soft, hard) rlimits, applied by itself between fork and exec."""
    memory = limits.memory_mb << 20
    out = [
        (resource.RLIMIT_AS, memory, memory),
        (resource.RLIMIT_NOFILE, OPEN_FILES, OPEN_FILES),
        (resource.RLIMIT_NPROC, limits.pids, limits.pids),
    ]
    if cpu_seconds is not None:
        soft = max(int(cpu_seconds + 0.999), 1)
        out.append((resource.RLIMIT_CPU, soft, soft + 1))
    return out

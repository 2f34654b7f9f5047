"""A container's OOM-kill and pids-limit counters, read from its cgroup files on the host (v1 or v2,
found through its init pid). Where they cannot be seen (a remote engine), `Counters.read` returns
None and the caller reads the same files inside the container.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

CGROUP_ROOT = Path("/sys/fs/cgroup")
# (file under the v1 controller dir or the v2 unified dir, key) per counter
_V1 = {"oom_kill": ("memory", "memory.oom_control"), "pids_max": ("pids", "pids.events")}
_V2 = {"oom_kill": "memory.events", "pids_max": "pids.events"}
_KEYS = {"oom_kill": "oom_kill", "pids_max": "max"}
# Inside the container, its own cgroup is mounted at the root of each hierarchy.
IN_CONTAINER_PROBE = (
    "for f in /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events; do"
    ' [ -r $f ] && sed -n "s/^oom_kill /oom_kill /p" $f; done;'
    " for f in /sys/fs/cgroup/pids/pids.events /sys/fs/cgroup/pids.events; do"
    ' [ -r $f ] && sed -n "s/^max /pids_max /p" $f; done; true'
)


class Snapshot(msgspec.Struct, frozen=True):
    oom_kill: int = 0
    pids_max: int = 0


def parse_counters(text: str) -> Snapshot:
    """`oom_kill N` / `pids_max N` lines (the in-container probe's output) -> Snapshot."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key in ("oom_kill", "pids_max") and value.strip().isdigit():
            values[key] = int(value)
    return Snapshot(**values)


def _read_key(path: Path, key: str) -> int:
    for line in path.read_text().splitlines():
        k, _, v = line.partition(" ")
        if k == key:
            return int(v)
    return 0


class Counters:
    """Host-side counter files of one container (empty when they cannot be found)."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    @classmethod
    def for_pid(cls, pid: int) -> Counters:
        """Locate the counter files of the cgroups of host process `pid` (the container's init)."""
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            return cls({})
        files: dict[str, Path] = {}
        for line in lines:
            _, controllers, path = line.split(":", 2)
            rel = path.lstrip("/")
            if controllers == "":  # cgroup v2 unified hierarchy
                for name, fname in _V2.items():
                    files.setdefault(name, CGROUP_ROOT / rel / fname)
            for name, (controller, fname) in _V1.items():
                if controller in controllers.split(","):
                    files[name] = CGROUP_ROOT / controller / rel / fname
        return cls({k: p for k, p in files.items() if p.is_file()})

    def read(self) -> Snapshot | None:
        """Current counters, or None when they cannot be read here."""
        if not self.files:
            return None
        try:
            return Snapshot(**{k: _read_key(p, _KEYS[k]) for k, p in self.files.items()})
        except (OSError, ValueError):
            return None

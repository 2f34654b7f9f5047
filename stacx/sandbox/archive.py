"""Tar archives for the Docker archive API (uploads into a container).

Directory entries are only ever written for directories that do not exist yet (the caller
decides), so an existing directory's mode, say /tmp's 1777, is never reset by an upload.
"""

from __future__ import annotations

import io
import tarfile
import time
from pathlib import Path

from stacx.errors import SandboxError


def tar_files(files: dict[str, tuple[bytes, int]], prefix: str = "") -> bytes:
    """A tar of in-memory files; with `prefix`, under a directory entry of that name."""
    buf = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buf, mode="w") as tar:
        if prefix:
            info = tarfile.TarInfo(prefix)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, now
            tar.addfile(info)
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(f"{prefix}/{name}" if prefix else name)
            info.size, info.mode, info.mtime = len(data), mode, now
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def log_dirs_tar(dirs: tuple[str, ...], *, under_logs: bool = False) -> bytes:
    """`dirs` (e.g. /logs/verifier, /logs/agent) under /logs, writable by any user (a task's
    USER may not be root); `under_logs`: names relative to /logs (to extract there)."""
    buf = io.BytesIO()
    entries = (("logs", 0o755), *((d.lstrip("/"), 0o777) for d in dirs))
    if under_logs:
        entries = tuple((n.removeprefix("logs/"), m) for n, m in entries[1:])
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, mode in entries:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, int(time.time())
            tar.addfile(info)
    return buf.getvalue()


def tar_directory(local_dir: str | Path, prefix: str = "") -> bytes:
    """An uncompressed tar of a directory's contents (paths relative to it, modes kept);
    with `prefix`, the directory itself is the top entry, named `prefix`."""
    if not Path(local_dir).is_dir():
        raise SandboxError(f"upload: {local_dir} is not a directory")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        if prefix:  # a fresh directory: 0755 like mkdir, whatever the local one's mode
            info = tarfile.TarInfo(prefix)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
            tar.addfile(info)
        for path in sorted(Path(local_dir).iterdir()):
            tar.add(path, arcname=f"{prefix}/{path.name}" if prefix else path.name)
    return buf.getvalue()

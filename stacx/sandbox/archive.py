"""Tar archives for the Docker archive API. Directory entries are written only for directories that
do not exist yet, so an existing one's mode (/tmp's 1777) is never reset by an upload.
"""

from __future__ import annotations

import io
import tarfile
import time
from pathlib import Path

from stacx.errors import SandboxError


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, int(time.time())
    tar.addfile(info)


def tar_files(files: dict[str, tuple[bytes, int]], prefix: str = "") -> bytes:
    """A tar of in-memory files; with `prefix`, under a directory entry of that name."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        if prefix:
            _add_dir(tar, prefix)
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(f"{prefix}/{name}" if prefix else name)
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def log_dirs_tar(dirs: tuple[str, ...], *, under_logs: bool = False) -> bytes:
    """`dirs` under /logs, writable by any user; `under_logs`: names relative to /logs."""
    buf = io.BytesIO()
    entries = (("logs", 0o755), *((d.lstrip("/"), 0o777) for d in dirs))
    if under_logs:
        entries = tuple((n.removeprefix("logs/"), m) for n, m in entries[1:])
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, mode in entries:
            _add_dir(tar, name, mode)
    return buf.getvalue()


def tar_directory(local_dir: str | Path, prefix: str = "") -> bytes:
    """A tar of a directory's contents (modes kept); with `prefix`, under that top entry."""
    if not Path(local_dir).is_dir():
        raise SandboxError(f"upload: {local_dir} is not a directory")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        if prefix:  # a fresh directory: 0755 like mkdir, whatever the local one's mode
            _add_dir(tar, prefix)
        for path in sorted(Path(local_dir).iterdir()):
            tar.add(path, arcname=f"{prefix}/{path.name}" if prefix else path.name)
    return buf.getvalue()

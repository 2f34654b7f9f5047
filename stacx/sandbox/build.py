"""Task images: a task's environment/ built to a tag named by its content hash.

The hash covers the Dockerfile after its FROM lines went through the alias map, every file of
the build context (path, executable bit, bytes) and the image ids of the resolved bases, so an
edit to any of them, or a rebuilt base, gives a new tag; an unchanged task is never rebuilt.
Tags look like `stacx/task-<task id>:<16 hex>`.

Builds go through the engine's build API (the classic builder: no BuildKit-only syntax such as
`RUN --mount`). `.dockerignore` is honoured for plain patterns only (fnmatch, no `!` negation).
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import io
import re
import tarfile
import weakref
from collections.abc import Callable
from pathlib import Path

import aiodocker

from stacx.errors import TaskError
from stacx.ports import Task
from stacx.sandbox.aliases import AliasMap, rewrite_dockerfile

Log = Callable[[str], None]
# one build per tag at a time; asyncio locks belong to one event loop, so key by loop too
_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = weakref.WeakKeyDictionary()


def _context_files(env_dir: Path) -> list[Path]:
    ignore_file = env_dir / ".dockerignore"
    patterns = []
    if ignore_file.is_file():
        patterns = [
            ln.strip().strip("/")
            for ln in ignore_file.read_text().splitlines()
            if ln.strip() and not ln.startswith("#") and not ln.startswith("!")
        ]
    files = []
    for path in sorted(env_dir.rglob("*")):
        rel = path.relative_to(env_dir).as_posix()
        if path.is_dir() or rel == "Dockerfile":
            continue
        if any(fnmatch.fnmatch(rel, p) or rel.startswith(p + "/") for p in patterns):
            continue
        files.append(path)
    return files


def slug(task_id: str) -> str:
    """A task id made safe for an image repository name."""
    s = re.sub(r"[^a-z0-9._-]+", "-", task_id.lower()).strip("-._")
    return s[:100] or "task"


async def _image_id(docker: aiodocker.Docker, image: str, task: str) -> str:
    try:
        info = await docker.images.inspect(image)
    except aiodocker.DockerError as exc:
        hint = " (run `stacx images bootstrap`)" if image.startswith("stacx/base") else ""
        raise TaskError(f"task {task}: base image {image} is not built{hint}") from exc
    return str(info["Id"])


async def plan(
    task: Task, docker: aiodocker.Docker, aliases: AliasMap
) -> tuple[str, str, list[Path]]:
    """The tag to build, the rewritten Dockerfile and the context files (no build yet)."""
    dockerfile = task.environment_dir / "Dockerfile"
    text, bases = rewrite_dockerfile(dockerfile.read_text(), aliases, task=task.task_id)
    files = _context_files(task.environment_dir)
    h = hashlib.sha256()
    h.update(b"dockerfile\0" + text.encode() + b"\0")
    for base in bases:
        h.update(b"base\0" + (await _image_id(docker, base, task.task_id)).encode() + b"\0")
    for path in files:
        rel = path.relative_to(task.environment_dir).as_posix()
        executable = path.stat().st_mode & 0o111 != 0
        h.update(f"file\0{rel}\0{int(executable)}\0".encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return f"stacx/task-{slug(task.task_id)}:{h.hexdigest()[:16]}", text, files


def _context_tar(env_dir: Path, dockerfile: str, files: list[Path]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
        for path in files:
            tar.add(path, arcname=path.relative_to(env_dir).as_posix(), recursive=False)
    return buf.getvalue()


async def build_task_image(
    task: Task,
    docker: aiodocker.Docker,
    aliases: AliasMap | None = None,
    *,
    force: bool = False,
    log: Log = lambda _msg: None,
) -> str:
    """The task's image tag, built if missing (or if `force`). TaskError names the task and
    carries the build log's tail when the build fails or passes environment.build_timeout_sec."""
    aliases = aliases or AliasMap.from_env()
    if not (task.environment_dir / "Dockerfile").is_file():
        image = task.config.environment.docker_image
        if not image:
            raise TaskError(f"task {task.task_id}: no environment/Dockerfile and no docker_image")
        return aliases.resolve(image, task=task.task_id)
    tag, dockerfile, files = await plan(task, docker, aliases)
    async with _locks.setdefault(asyncio.get_running_loop(), {}).setdefault(tag, asyncio.Lock()):
        if not force:
            try:
                await docker.images.inspect(tag)
                return tag
            except aiodocker.DockerError:
                pass
        log(f"building {tag} for task {task.task_id}")
        context = _context_tar(task.environment_dir, dockerfile, files)
        lines: list[str] = []
        try:
            async with asyncio.timeout(task.config.environment.build_timeout_sec):
                async for chunk in docker.images.build(
                    fileobj=io.BytesIO(context),
                    encoding="gzip",
                    tag=tag,
                    rm=True,
                    forcerm=True,
                    labels={"stacx.task": task.task_id},
                    stream=True,
                ):
                    if "stream" in chunk:
                        lines.extend(str(chunk["stream"]).splitlines())
                        del lines[:-60]
                    if "error" in chunk:
                        raise TaskError(
                            f"task {task.task_id}: image build failed: {chunk['error']}\n"
                            + "\n".join(lines[-30:])
                        )
        except TimeoutError as exc:
            raise TaskError(
                f"task {task.task_id}: image build passed environment.build_timeout_sec="
                f"{task.config.environment.build_timeout_sec:g}\n" + "\n".join(lines[-30:])
            ) from exc
        except aiodocker.DockerError as exc:
            raise TaskError(f"task {task.task_id}: image build failed: {exc}") from exc
    return tag

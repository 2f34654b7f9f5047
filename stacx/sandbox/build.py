"""Task images: a task's environment/ built to `stacx/task-<id>:<16 hex>`, a hash of the aliased
Dockerfile, the context files and the resolved bases' ids: an unchanged task is never rebuilt.

Design: docs/sandboxes.md#task-images
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import io
import json
import re
import tarfile
import weakref
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiodocker
import msgspec
from aiodocker.types import SENTINEL

from stacx.errors import TaskError
from stacx.ports import Task
from stacx.sandbox.aliases import AliasMap, python_shim, rewrite_dockerfile
from stacx.sandbox.buildkit import follow, needs_buildkit
from stacx.sandbox.heredocs import expand_heredocs
from stacx.sandbox.images import ensure_base
from stacx.sandbox.standins import PREFIX as STANDIN
from stacx.sandbox.standins import ensure_standin, standin_base

Log = Callable[[str], None]
# one build per tag at a time; asyncio locks belong to one event loop, so key by loop too
_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


class BuildOptions(msgspec.Struct, frozen=True, kw_only=True):
    """A compose `build:`: Dockerfile (relative to the context), build args, target (None: last)."""

    dockerfile: str = "Dockerfile"
    args: dict[str, str] = msgspec.field(default_factory=dict)
    target: str | None = None


PLAIN = BuildOptions()


def _context_files(env_dir: Path, dockerfile: str = "Dockerfile") -> list[Path]:
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
        if path.is_dir() or rel == dockerfile:
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
    task: Task,
    docker: aiodocker.Docker,
    aliases: AliasMap,
    env_dir: Path | None = None,
    variant: str = "",
    options: BuildOptions = PLAIN,
) -> tuple[str, str, list[Path]]:
    """The tag, the rewritten Dockerfile and the context files; `env_dir`: another build context."""
    env_dir = env_dir or task.environment_dir
    dockerfile = env_dir / options.dockerfile
    plain, _ = expand_heredocs(dockerfile.read_text(), task=task.task_id)
    text, bases = rewrite_dockerfile(plain, aliases, task=task.task_id, build_args=options.args)
    files = _context_files(env_dir, options.dockerfile)
    h = hashlib.sha256()
    h.update(b"dockerfile\0" + text.encode() + b"\0")
    if options != PLAIN:
        h.update(b"options\0" + msgspec.json.encode(options) + b"\0")
    if plain != dockerfile.read_text():  # heredoc bodies: hashed with the original text
        h.update(b"heredocs\0" + dockerfile.read_bytes() + b"\0")
    for base in bases:
        await _ensure(docker, aliases, base, task.task_id)
        h.update(b"base\0" + (await _image_id(docker, base, task.task_id)).encode() + b"\0")
    for path in files:
        rel = path.relative_to(env_dir).as_posix()
        executable = path.stat().st_mode & 0o111 != 0
        h.update(f"file\0{rel}\0{int(executable)}\0".encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    name = slug(task.task_id) + (f"-{slug(variant)}" if variant else "")
    return f"stacx/task-{name}:{h.hexdigest()[:16]}", text, files


async def local_image(
    docker: aiodocker.Docker, aliases: AliasMap, image: str, *, task: str = "?"
) -> str:
    """The local image standing for `image`, a STACX base or stand-in built first if needed."""
    target = aliases.resolve(image, task=task)
    await _ensure(docker, aliases, target, task)
    return target


async def _ensure(docker: aiodocker.Docker, aliases: AliasMap, target: str, task: str) -> None:
    """Build `target` when it is a STACX base or stand-in that the engine lacks."""
    if target.startswith(STANDIN):
        base = standin_base(target)
        on = None if base is None else aliases.resolve(base, task=task)
        if on is not None:
            await asyncio.to_thread(ensure_base, on)
        await ensure_standin(
            docker, target, on, prelude=python_shim(base) if base else "", task=task
        )
    await asyncio.to_thread(ensure_base, target)


def _context_tar(env_dir: Path, dockerfile: str, files: list[Path], name: str) -> bytes:
    """The build context: the rewritten Dockerfile (as `name`), its heredoc files, the rest."""
    buf = io.BytesIO()
    _, heredocs = expand_heredocs((env_dir / name).read_text())
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for arcname, data in [(name, dockerfile.encode()), *heredocs.items()]:
            info = tarfile.TarInfo(arcname)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        for path in files:
            tar.add(path, arcname=path.relative_to(env_dir).as_posix(), recursive=False)
    return buf.getvalue()


def _build(
    docker: aiodocker.Docker,
    context: bytes,
    tag: str,
    task_id: str,
    dockerfile: str,
    options: BuildOptions = PLAIN,
) -> AsyncIterator[dict[str, object]]:
    """The engine's build stream: BuildKit when the Dockerfile needs it, else classic."""
    labels = {"stacx.task": task_id}
    # aiodocker's build() has no `version` or `target` parameter: the engine's request itself
    params = {
        "t": tag,
        "rm": "1",
        "forcerm": "1",
        "labels": json.dumps(labels),
        "dockerfile": options.dockerfile,
        "buildargs": json.dumps(options.args),
    }
    if options.target is not None:
        params["target"] = options.target
    if needs_buildkit(dockerfile):
        params["version"] = "2"
    cm = docker._query(
        "build",
        "POST",
        params=params,
        headers={"content-type": "application/x-tar", "Content-Encoding": "gzip"},
        data=context,
        timeout=docker._resolve_long_running_timeout(SENTINEL),
    )
    handled: AsyncIterator[dict[str, object]] = docker.images._handle_response(cm, True)
    return handled


async def build_task_image(
    task: Task,
    docker: aiodocker.Docker,
    aliases: AliasMap | None = None,
    *,
    force: bool = False,
    log: Log = lambda _msg: None,
    env_dir: Path | None = None,
    docker_image: str | None = None,
    variant: str = "",
    options: BuildOptions = PLAIN,
) -> str:
    """The task's image tag, built if missing (or `force`); TaskError with the log's tail on
    failure. `env_dir` / `docker_image` / `options`: another image of the task
    (stacx/task-<id>-<variant>)."""
    aliases = aliases or AliasMap.from_env()
    env_dir = env_dir or task.environment_dir
    if not (env_dir / options.dockerfile).is_file():
        image = docker_image or task.config.environment.docker_image
        if not image:
            raise TaskError(
                f"task {task.task_id}: no {env_dir.name}/Dockerfile and no docker_image"
            )
        return await local_image(docker, aliases, image, task=task.task_id)
    tag, dockerfile, files = await plan(task, docker, aliases, env_dir, variant, options)
    async with _locks.setdefault(asyncio.get_running_loop(), {}).setdefault(tag, asyncio.Lock()):
        if not force:
            try:
                await docker.images.inspect(tag)
                return tag
            except aiodocker.DockerError:
                pass
        log(f"building {tag} for task {task.task_id}")
        context = _context_tar(env_dir, dockerfile, files, options.dockerfile)
        lines: list[str] = []
        try:
            async with asyncio.timeout(task.config.environment.build_timeout_sec):
                chunks = _build(docker, context, tag, task.task_id, dockerfile, options)
                await follow(chunks, f"task {task.task_id}: image build failed", lines)
        except TimeoutError as exc:
            raise TaskError(
                f"task {task.task_id}: image build passed environment.build_timeout_sec="
                f"{task.config.environment.build_timeout_sec:g}\n" + "\n".join(lines[-30:])
            ) from exc
    return tag

"""Image layers over task images: what an installed scaffold adds (its install, run at build time,
the only time the network is used), tagged by a hash of the base's id and the commands, built once
per (task image, scaffold); and the sandbox limits to run it with (no network, its mounts).

Design: docs/scaffolds.md#isolation
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import weakref

import aiodocker
import msgspec

from stacx.errors import TaskError
from stacx.ports import Limits
from stacx.sandbox.archive import tar_files
from stacx.sandbox.buildkit import follow

BUILD_TIMEOUT_S = 900.0
# one build per tag at a time (episodes of one task start together); locks belong to one loop
_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


class ImageLayer(msgspec.Struct, frozen=True, kw_only=True):
    name: str  # names the tag: stacx/scaffold-<name>
    run: list[str]  # shell commands, one RUN each (network on: this is the install)
    mounts: dict[str, str] = msgspec.field(default_factory=dict)  # host dir -> container dir
    env: dict[str, str] = msgspec.field(default_factory=dict)


def dockerfile(base: str, layer: ImageLayer) -> str:
    return f"FROM {base}\n" + "".join(f"RUN {cmd}\n" for cmd in layer.run)


async def layered_image(docker: aiodocker.Docker, base: str, layer: ImageLayer) -> str:
    """The tag of `layer` over `base`, built if missing (see the module docstring)."""
    try:
        base_id = str((await docker.images.inspect(base))["Id"])
    except aiodocker.DockerError as exc:
        raise TaskError(f"scaffold layer {layer.name}: base image {base} not found") from exc
    text = dockerfile(base_id, layer)
    tag = f"stacx/scaffold-{layer.name}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    async with _locks.setdefault(asyncio.get_running_loop(), {}).setdefault(tag, asyncio.Lock()):
        try:
            await docker.images.inspect(tag)
        except aiodocker.DockerError:
            await _build(docker, base, layer, text, tag)
    return tag


async def _build(
    docker: aiodocker.Docker, base: str, layer: ImageLayer, text: str, tag: str
) -> None:
    what = f"scaffold layer {layer.name} over {base}: build failed"
    lines: list[str] = []
    try:
        async with asyncio.timeout(BUILD_TIMEOUT_S):
            chunks = docker.images.build(
                fileobj=io.BytesIO(
                    gzip.compress(tar_files({"Dockerfile": (text.encode(), 0o644)}), 1)
                ),
                encoding="gzip",  # aiodocker refuses a file object without one
                tag=tag,
                rm=True,
                forcerm=True,
                labels={"stacx.scaffold": layer.name, "stacx.base": base},
                stream=True,
            )
            await follow(chunks, what, lines)
    except TimeoutError as exc:
        raise TaskError(f"{what}: {exc!r}\n" + "\n".join(lines[-30:])) from exc


def layered_limits(limits: Limits, layer: ImageLayer) -> Limits:
    """The task's limits with no network, plus the layer's mounts and environment."""
    return msgspec.structs.replace(
        limits,
        allow_internet=False,
        mounts={**limits.mounts, **layer.mounts},
        env={**limits.env, **layer.env},
    )

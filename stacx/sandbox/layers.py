"""Image layers over task images: what an installed scaffold adds to a task's sandbox.

`layered_image` builds ``FROM <task image>`` plus the layer's RUN commands, tagged
``stacx/scaffold-<name>:<16 hex>`` by a hash of the base image's id and the commands, so it is
built once per (task image, scaffold) and reused by every later episode and run; a rebuilt task
image gives a new tag. The install runs at build time, the only time the network is used.
`layered_limits` makes the sandbox's own limits: network none, the layer's mounts (the gateway
socket directory) and environment added.

Not here: what the scaffold is (stacx.agents.installed) or where the socket comes from
(stacx.launch). Guarantees: a failed build is a TaskError naming the layer and the base image,
with the build log's tail.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import tarfile
import weakref

import aiodocker
import msgspec

from stacx.errors import TaskError
from stacx.ports import Limits

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
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(text.encode())
        tar.addfile(info, io.BytesIO(text.encode()))
    lines: list[str] = []
    try:
        async with asyncio.timeout(BUILD_TIMEOUT_S):
            async for chunk in docker.images.build(
                fileobj=io.BytesIO(buf.getvalue()),
                encoding="gzip",
                tag=tag,
                rm=True,
                forcerm=True,
                labels={"stacx.scaffold": layer.name, "stacx.base": base},
                stream=True,
            ):
                if "stream" in chunk:
                    lines.extend(str(chunk["stream"]).splitlines())
                    del lines[:-60]
                if "error" in chunk:
                    raise TaskError(
                        f"scaffold layer {layer.name} over {base}: build failed: "
                        f"{chunk['error']}\n" + "\n".join(lines[-30:])
                    )
    except (TimeoutError, aiodocker.DockerError) as exc:
        raise TaskError(
            f"scaffold layer {layer.name} over {base}: build failed: {exc!r}\n"
            + "\n".join(lines[-30:])
        ) from exc


def layered_limits(limits: Limits, layer: ImageLayer) -> Limits:
    """The task's limits with no network, plus the layer's mounts and environment."""
    return msgspec.structs.replace(
        limits,
        allow_internet=False,
        mounts={**limits.mounts, **layer.mounts},
        env={**limits.env, **layer.env},
    )

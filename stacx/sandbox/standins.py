"""Offline stand-ins for images whose content can be rebuilt from the package registries here.

Some images that Harbor tasks name only carry a program that is also published as a package:
`ghcr.io/astral-sh/uv:<tag>` is uv's two binaries (`/uv`, `/uvx`) in an empty image, and its
Debian / Python variants are those binaries in /usr/local/bin of a Debian or Python image. With
no image registry, the stand-in is built locally from the package index pip is configured with
(`pip download` of the same version's static musllinux wheel, whose binaries are the release's
own), tagged `stacx/standin-uv:<the same tag>`, once per engine:

- `latest`, `X.Y.Z`, `X.Y` -> FROM scratch with /uv and /uvx (`latest`: the newest version the
  index has when the stand-in is first built; it is then kept);
- `[X.Y.Z-]pythonX.Y-<suite>[-slim]`, `[X.Y.Z-]<suite>[-slim]` (bookworm, trixie) and
  `[X.Y.Z-]debian[-slim]` (trixie) -> the alias map's stand-in for that Python / Debian image,
  plus the binaries in /usr/local/bin; its fidelity is the base's (`AliasMap.fidelity`).

Not covered (no stand-in; the build reports the image as unresolvable): alpine variants, other
images. A version the index does not have fails the build with pip's message.
"""

from __future__ import annotations

import asyncio
import io
import platform
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import aiodocker

from stacx.errors import TaskError

PREFIX = "stacx/standin-"
UV_REPO = "ghcr.io/astral-sh/uv"
_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?$")
_VARIANT = re.compile(r"^(?:python(3\.\d+)-)?(bookworm|trixie|debian)(-slim)?$")
_WHEEL_ARCH = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


def standin(image: str) -> str | None:
    """The stand-in tag for `image` (a normalized name, registry included), or None."""
    repo, _, tag = image.partition(":")
    if repo != UV_REPO or _split(tag or "latest") is None:
        return None
    return f"{PREFIX}uv:{tag or 'latest'}"


def standin_base(tag: str) -> str | None:
    """The image a variant stand-in is built on (a name for the alias map), None for scratch."""
    split = _split(tag.rpartition(":")[2])
    assert split is not None, tag
    variant = split[1]
    if not variant:
        return None
    m = _VARIANT.match(variant)
    assert m is not None, variant
    python, suite, slim = m.groups()
    suite = "trixie" if suite == "debian" else suite
    if python:
        return f"python:{python}{slim or ''}-{suite}"
    return f"debian:{suite}{slim or ''}"


def _split(tag: str) -> tuple[str | None, str] | None:
    """(version or None for the newest, variant or ""), or None when not a stand-in tag."""
    if tag == "latest":
        return None, ""
    head, _, rest = tag.partition("-")
    version, variant = (head, rest) if _VERSION.match(head) else (None, tag)
    if variant and not _VARIANT.match(variant):
        return None
    return version, variant


async def ensure_standin(
    docker: aiodocker.Docker, tag: str, base: str | None, *, prelude: str = "", task: str = "?"
) -> None:
    """Build stand-in `tag` if the engine lacks it; `base`: the local image a variant goes on
    (already resolved through the alias map), `prelude`: Dockerfile lines run on it first.
    TaskError with the reason when it cannot."""
    try:
        await docker.images.inspect(tag)
        return
    except aiodocker.DockerError:
        pass
    split = _split(tag.rpartition(":")[2])
    assert split is not None, tag
    version = split[0]
    with tempfile.TemporaryDirectory() as tmp:
        binaries = await asyncio.to_thread(_uv_binaries, version, Path(tmp), task)
        dest = "/usr/local/bin/" if base else "/"
        steps = [
            f"FROM {base or 'scratch'}",
            *([prelude] if prelude else []),
            f"COPY uv uvx {dest}",
        ]
        dockerfile = "\n".join(steps) + "\n"
        context = _context(dockerfile, binaries)
    lines: list[str] = []
    try:
        async for chunk in docker.images.build(
            fileobj=io.BytesIO(context),
            encoding="gzip",
            tag=tag,
            rm=True,
            forcerm=True,
            labels={"stacx.standin": f"{UV_REPO}:{tag.rpartition(':')[2]}"},
            stream=True,
        ):
            lines.extend(str(chunk.get("stream", "")).splitlines())
            if "error" in chunk:
                raise TaskError(
                    f"task {task}: stand-in {tag}: {chunk['error']}\n" + "\n".join(lines[-20:])
                )
    except aiodocker.DockerError as exc:
        raise TaskError(f"task {task}: stand-in {tag}: {exc}\n" + "\n".join(lines[-20:])) from exc


def _uv_binaries(version: str | None, into: Path, task: str) -> dict[str, bytes]:
    """uv and uvx of `version` (None: the newest) from the static musllinux wheel, fetched by
    pip from the index it is configured with."""
    arch = _WHEEL_ARCH.get(platform.machine().lower())
    if arch is None:
        raise TaskError(f"task {task}: no uv stand-in for machine {platform.machine()}")
    spec = (
        "uv"
        if version is None
        else f"uv=={version}"
        if version.count(".") == 2
        else f"uv=={version}.*"
    )
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--platform",
        f"musllinux_1_1_{arch}",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(into),
        spec,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
    wheels = sorted(into.glob("uv-*.whl"))
    if done.returncode != 0 or not wheels:
        raise TaskError(
            f"task {task}: the uv stand-in needs {spec} from the package index: "
            f"{(done.stderr or done.stdout).strip()[-800:]}"
        )
    with zipfile.ZipFile(wheels[0]) as whl:
        found = {
            n.rpartition("/")[2]: whl.read(n)
            for n in whl.namelist()
            if ".data/scripts/" in n and n.rpartition("/")[2] in ("uv", "uvx")
        }
    if set(found) != {"uv", "uvx"}:
        raise TaskError(f"task {task}: {wheels[0].name} holds no uv / uvx binaries")
    return found


def _context(dockerfile: str, binaries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for name, data, mode in [
            ("Dockerfile", dockerfile.encode(), 0o644),
            *((n, b, 0o755) for n, b in binaries.items()),
        ]:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()

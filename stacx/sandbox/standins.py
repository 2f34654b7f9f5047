"""Offline stand-ins for images whose content a package registry holds: uv's images
(`ghcr.io/astral-sh/uv:<tag>`) rebuilt as `stacx/standin-uv:<tag>` from the same version's wheel on
the configured pip index. Other images have none (the build reports them unresolvable).

Design: docs/sandboxes.md#task-images
"""

from __future__ import annotations

import asyncio
import gzip
import io
import platform
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import aiodocker

from stacx.errors import TaskError
from stacx.sandbox.archive import tar_files
from stacx.sandbox.buildkit import follow

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
    """Build stand-in `tag` if missing, on `base` after `prelude`; TaskError when it cannot."""
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
    steps = [
        f"FROM {base or 'scratch'}",
        prelude,
        f"COPY uv uvx {'/usr/local/bin/' if base else '/'}",
    ]
    dockerfile = "\n".join(s for s in steps if s) + "\n"
    files = {"Dockerfile": (dockerfile.encode(), 0o644)}
    context = tar_files(files | {n: (b, 0o755) for n, b in binaries.items()})
    chunks = docker.images.build(
        fileobj=io.BytesIO(gzip.compress(context, 1)),
        encoding="gzip",  # aiodocker refuses a file object without one
        tag=tag,
        rm=True,
        forcerm=True,
        labels={"stacx.standin": f"{UV_REPO}:{tag.rpartition(':')[2]}"},
        stream=True,
    )
    await follow(chunks, f"task {task}: stand-in {tag}", [])


def _uv_binaries(version: str | None, into: Path, task: str) -> dict[str, bytes]:
    """uv and uvx of `version` (None: the newest) from the static musllinux wheel, via pip."""
    arch = _WHEEL_ARCH.get(platform.machine().lower())
    if arch is None:
        raise TaskError(f"task {task}: no uv stand-in for machine {platform.machine()}")
    spec = "uv" if version is None else f"uv=={version}" + ("" if version.count(".") == 2 else ".*")
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

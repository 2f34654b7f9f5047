"""BuildKit through the Docker API (``POST /build?version=2``) for the Dockerfiles that need it, a
minimal protobuf reader of its progress, and `follow`: any build read to its end, so that a failed
build keeps its log.

Design: docs/sandboxes.md#task-images
"""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator

import aiodocker

from stacx.errors import TaskError

_NEEDS = re.compile(r"^\s*(RUN|COPY|ADD)\s+(?:--\S+\s+)*--(mount|chmod|link)\b", re.I | re.M)


def needs_buildkit(dockerfile: str) -> bool:
    """Whether the Dockerfile uses flags only BuildKit knows (RUN --mount, COPY --chmod)."""
    return _NEEDS.search(dockerfile) is not None


async def follow(chunks: AsyncIterator[dict[str, object]], what: str, lines: list[str]) -> None:
    """Read a build's progress to its end (its last 60 lines in `lines`); on its error (or the
    engine's), TaskError `what: error` with the last 30 lines."""
    try:
        async for chunk in chunks:
            if "stream" in chunk:
                lines.extend(str(chunk["stream"]).splitlines())
            if chunk.get("id") == "moby.buildkit.trace":
                lines.extend(trace_lines(str(chunk.get("aux") or "")))
            del lines[:-60]
            if "error" in chunk:
                raise TaskError(f"{what}: {chunk['error']}\n" + "\n".join(lines[-30:]))
    except aiodocker.DockerError as exc:  # also the build's in-band error, raised by aiodocker
        raise TaskError(f"{what}: {exc}\n" + "\n".join(lines[-30:])) from exc


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, varint or bytes) of one protobuf message (fixed-width fields skipped)."""
    out: list[tuple[int, int | bytes]] = []
    i = 0

    def varint() -> int:
        nonlocal i
        shift = value = 0
        while i < len(data):
            b = data[i]
            i += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        return value

    while i < len(data):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            out.append((number, varint()))
        elif wire == 2:
            n = varint()
            out.append((number, data[i : i + n]))
            i += n
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:  # groups: not used by BuildKit's status messages
            break
    return out


def trace_lines(aux: str) -> list[str]:
    """Readable lines of one ``moby.buildkit.trace`` message: vertex names, logs, errors."""
    try:
        message = base64.b64decode(aux)
    except ValueError:
        return []
    lines: list[str] = []
    for number, value in _fields(message):
        if not isinstance(value, bytes):
            continue
        if number == 1:  # Vertex: 3 name, 6 completed, 7 error
            vertex = dict(_fields(value))
            name, error = vertex.get(3), vertex.get(7)
            if isinstance(name, bytes) and 6 not in vertex:
                lines.append("#" + name.decode(errors="replace"))
            if isinstance(error, bytes) and error:
                lines.append("ERROR: " + error.decode(errors="replace"))
        elif number == 3:  # VertexLog: 4 msg
            msg = dict(_fields(value)).get(4)
            if isinstance(msg, bytes):
                lines.extend(msg.decode(errors="replace").splitlines())
    return lines

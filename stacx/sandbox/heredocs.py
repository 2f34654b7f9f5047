"""Dockerfile heredocs (`RUN <<EOF`, `RUN cmd <<EOF`, `COPY <<EOF /path`) rewritten into build
context files, for builders that have none (the engine here is 20.10).

Design: docs/sandboxes.md#task-images
"""

from __future__ import annotations

import re

from stacx.errors import TaskError

PREFIX = ".stacx-heredoc-"
_HEREDOC = re.compile(r"<<(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
_INSTRUCTION = re.compile(r"^(\s*)(RUN|COPY)(\s+(?:--\S+\s+)*)(.*)$", re.IGNORECASE)


def expand_heredocs(text: str, *, task: str = "?") -> tuple[str, dict[str, bytes]]:
    """The Dockerfile without heredocs, and the context files that replace them."""
    lines = text.splitlines()
    out: list[str] = []
    files: dict[str, bytes] = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _INSTRUCTION.match(line)
        heredoc = _HEREDOC.search(m.group(4)) if m else None
        if m is None or heredoc is None:
            out.append(line)
            i += 1
            continue
        strip_tabs, word = heredoc.group(1) == "-", heredoc.group(3)
        body: list[str] = []
        i += 1
        while i < len(lines) and (lines[i].lstrip("\t") if strip_tabs else lines[i]) != word:
            body.append(lines[i].lstrip("\t") if strip_tabs else lines[i])
            i += 1
        if i == len(lines):
            raise TaskError(f"task {task}: Dockerfile heredoc <<{word} is never closed")
        i += 1  # the delimiter line
        name = f"{PREFIX}{len(files)}"
        content = "\n".join(body) + "\n"
        files[name] = content.encode()
        indent, op, flags, rest = m.groups()
        before, after = rest[: heredoc.start()].strip(), rest[heredoc.end() :].strip()
        path = f"/{name}"
        if op.upper() == "COPY":
            out.append(f"{indent}COPY{flags}{name} {after}")
            continue
        out.append(f"{indent}COPY {name} {path}")
        if before:  # `cmd <<EOF`: the body is the command's stdin
            command = f"{before} < {path} {after}".strip()
        elif content.startswith("#!"):  # its interpreter (no chmod: USER may not be root)
            command = f"{body[0][2:].strip()} {path} {after}".strip()
        else:
            command = f"/bin/sh {path} {after}".strip()
        out.append(f"{indent}RUN{flags}({command}); rc=$?; rm -f {path}; exit $rc")
    return "\n".join(out) + ("\n" if text.endswith("\n") else ""), files

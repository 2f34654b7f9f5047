"""The `Environments` port over process sandboxes (`sandbox.backend = "process"`), for image-less
tasks: no image is built (a Dockerfile's context COPY / ADD is uploaded, nothing else is done);
failures map as DockerEnvironments maps them; each episode gets a fresh root.

Design: docs/sandboxes.md#image-less-tasks-on-the-process-backend
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Self

from stacx.errors import SandboxError, TaskError
from stacx.events import Emit, FailureKind
from stacx.ports import Environments, InfraFailure, Limits, Sandbox, Task, Verdict
from stacx.sandbox.answers import is_answer_task, verify_answer
from stacx.sandbox.lifecycle import Lifecycle
from stacx.sandbox.limits import task_limits
from stacx.sandbox.process import ProcessSandbox, isolation
from stacx.sandbox.verifier import run_verifier, verdict

log = logging.getLogger(__name__)
IMAGE = "process"  # SandboxStarted.image of a process sandbox


class ProcessEnvironments(Lifecycle):
    """Process-backed `Environments`; an async context manager (it owns nothing long-lived)."""

    def __init__(self, *, run_id: str, emit: Emit | None = None, workdir: str = "/app") -> None:
        super().__init__(run_id=run_id, emit=emit)
        self.workdir = workdir
        self._warned: set[str] = set()

    async def __aenter__(self) -> Self:
        isolation()  # probe (and warn) once, before the first episode
        return self

    async def _start(
        self, stack: contextlib.AsyncExitStack, task: Task, episode_id: str
    ) -> Sandbox:
        sandbox = ProcessSandbox(
            self._limits(task), workdir=self.workdir, run_id=self.run_id, episode_id=episode_id
        )
        await sandbox.start()
        reason = "released"

        async def release() -> None:
            await sandbox.close()
            await self.stopped(sandbox.id, episode_id, reason)

        stack.push_async_callback(release)
        await self.started(sandbox.id, IMAGE, episode_id, sandbox.start_ms)
        try:
            await upload_context(sandbox, task, self.workdir)
            await self._ready(sandbox, task, episode_id)
        except SandboxError:
            reason = "unhealthy"
            raise
        return sandbox

    def _limits(self, task: Task) -> Limits:
        """The task's limits, once this machine gives a sandbox its own /logs and /tests."""
        if isolation().isolation != "namespaces":
            raise InfraFailure(
                FailureKind.START,
                "the process backend needs mount namespaces (unshare --mount) to give a task "
                "its own /logs and /tests; this machine has none",
            )
        has_image = (task.environment_dir / "Dockerfile").is_file() or bool(
            task.config.environment.docker_image
        )
        if has_image and task.task_id not in self._warned:
            self._warned.add(task.task_id)
            log.warning(
                "task %s has an image; the process backend runs it on the host instead",
                task.task_id,
            )
        try:
            return task_limits(task)
        except TaskError as exc:
            raise InfraFailure(FailureKind.START, str(exc)) from exc

    async def verify(self, sandbox: Sandbox, task: Task, *, episode_id: str) -> Verdict:
        """Harbor's verifier (tests/test.sh), or an answer task's answer check (sandbox.answers)."""
        if is_answer_task(task):
            return verdict(await verify_answer(sandbox, task))
        result = verdict(await run_verifier(sandbox, task))
        await self._next_step(sandbox, task, result, episode_id)
        return result


_INSTRUCTION = re.compile(r"^\s*(WORKDIR|COPY|ADD)\s+(.*)$", re.IGNORECASE)


def context_copies(env_dir: Path, workdir: str = "/app") -> list[tuple[Path, str]]:
    """(context path, sandbox path) of each COPY / ADD of a build-context file (see docs)."""
    dockerfile = env_dir / "Dockerfile"
    if not dockerfile.is_file():
        return []
    text = re.sub(r"\\\n", " ", dockerfile.read_text(errors="replace"))
    out: list[tuple[Path, str]] = []
    cwd = workdir
    for line in text.splitlines():
        m = _INSTRUCTION.match(line)
        if m is None:
            continue
        op, rest = m.group(1).upper(), m.group(2).strip()
        if op == "WORKDIR":
            cwd = posixpath.join(cwd, rest)
            continue
        try:
            words = shlex.split(rest) if not rest.startswith("[") else []
        except ValueError:  # unbalanced quotes: Docker's build reports it, not this
            continue
        args = [w for w in words if not w.startswith("--")]
        if len(args) < 2 or any(w.startswith("--from") for w in words) or "<<" in rest:
            continue
        *sources, dest = args
        dest = posixpath.join(cwd, dest)
        for src in sources:
            local = (env_dir / src).resolve()
            if (
                "://" in src
                or any(c in src for c in "*?[$")
                or not local.is_relative_to(env_dir.resolve())
                or not local.exists()
            ):
                continue
            into = dest.endswith("/") and local.is_file()
            out.append(
                (local, posixpath.join(dest, local.name) if into else dest.rstrip("/") or "/")
            )
    return out


async def upload_context(sandbox: Sandbox, task: Task, workdir: str) -> None:
    """Upload the build-context files the task's Dockerfile copies (`context_copies`)."""
    for local, remote in context_copies(task.environment_dir, workdir):
        if local.is_dir():
            await sandbox.upload_dir(str(local), remote)
        else:
            await sandbox.write_file(remote, local.read_bytes())


if TYPE_CHECKING:  # mypy checks that the adapter implements the port
    _conforms: type[Environments] = ProcessEnvironments

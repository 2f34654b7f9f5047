"""The `Environments` port (stacx.ports) over process sandboxes (stacx.sandbox.process), for
image-less tasks on machines without Docker: `sandbox.backend = "process"`.

A task needs no environment/Dockerfile here. A task that has one (or a docker_image) runs on
the host's own tree all the same, with a warning once per task: its image is not built and
nothing it installs is there. The workdir is /app (Harbor's convention; no image names one).
Of a Dockerfile, only the COPY / ADD of the task's own build-context files is honoured
(`context_copies`): they are uploaded where the image would have them, before the agent starts
(a task's data files, as the MLE tasks ship them); RUN, ENV, USER and the rest are not.

Failures, as DockerEnvironments maps them:
- a bad [environment] table (an unset ${VAR} in environment.env) -> START (no image to build);
- a sandbox that cannot be made, a machine with no mount namespace (the verifier's /logs and
  /tests could not be the sandbox's: see stacx.sandbox.process), a failing healthcheck -> START
  (a multi-step task's step whose setup.sh or own healthcheck fails: StepFailed, as Docker's);
- the verifier's own kinds (timeout, no reward, OOM, pids limit, transport), from run_verifier.
What the task's own processes hit while the agent acts (a MemoryError, a refused fork) is an
observation on the ExecResult, never an InfraFailure.

Sandboxes are never reused: each episode gets a fresh root, removed on exit.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import re
import shlex
from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self

from stacx.errors import SandboxError, TaskError
from stacx.events import Emit, FailureKind, SandboxStarted, SandboxStopped
from stacx.harbor.tasks import load_task, task_limits
from stacx.ports import Environments, InfraFailure, Limits, Sandbox, Task, Verdict
from stacx.sandbox.answers import is_answer_task, verify_answer
from stacx.sandbox.health import wait_healthy
from stacx.sandbox.process import ProcessSandbox, isolation
from stacx.sandbox.steps import following, start_step
from stacx.sandbox.verifier import run_verifier, verdict

log = logging.getLogger(__name__)
IMAGE = "process"  # SandboxStarted.image of a process sandbox


class ProcessEnvironments:
    """Process-backed `Environments`; an async context manager (it owns nothing long-lived)."""

    def __init__(self, *, run_id: str, emit: Emit | None = None, workdir: str = "/app") -> None:
        self.run_id = run_id
        self.emit = emit
        self.workdir = workdir
        self._warned: set[str] = set()
        self._multi: dict[str, Task] = {}  # episode -> its multi-step task (steps' checks)

    async def __aenter__(self) -> Self:
        isolation()  # probe (and warn) once, before the first episode
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    def task(self, path: str) -> Task:
        return load_task(path)

    @contextlib.asynccontextmanager
    async def sandbox(self, task: Task, *, episode_id: str) -> AsyncIterator[Sandbox]:
        limits = self._limits(task)
        sandbox = ProcessSandbox(
            limits, workdir=self.workdir, run_id=self.run_id, episode_id=episode_id
        )
        try:
            await sandbox.start()
        except SandboxError as exc:
            raise InfraFailure(FailureKind.START, str(exc)) from exc
        reason = "released"
        if task.step_tasks:
            self._multi[episode_id] = task
        try:
            if self.emit is not None:
                await self.emit(
                    SandboxStarted(
                        run_id=self.run_id,
                        sandbox_id=sandbox.id,
                        image=IMAGE,
                        episode_id=episode_id,
                        start_ms=sandbox.start_ms,
                    )
                )
            healthcheck = task.config.environment.healthcheck
            try:
                await upload_context(sandbox, task, self.workdir)
                if healthcheck is not None:
                    await wait_healthy(sandbox, healthcheck)
                if task.step_tasks:
                    await start_step(sandbox, task, task.step_tasks[0].step or "")
            except SandboxError as exc:
                reason = "unhealthy"
                raise InfraFailure(FailureKind.START, str(exc)) from exc
            yield sandbox
        finally:
            self._multi.pop(episode_id, None)
            await sandbox.close()
            if self.emit is not None:
                await self.emit(
                    SandboxStopped(
                        run_id=self.run_id,
                        sandbox_id=sandbox.id,
                        episode_id=episode_id,
                        reason=reason,
                    )
                )

    def _limits(self, task: Task) -> Limits:
        """The task's limits, once this machine is known to give it its own /logs and /tests
        (mount namespaces); a task with an image is run on the host, with a warning."""
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
        """Harbor's verifier (tests/test.sh), or for a light-format answer task (a jsonl
        problem) the answer check of stacx.sandbox.answers on the agent's answer file."""
        if is_answer_task(task):
            return verdict(await verify_answer(sandbox, task))
        result = verdict(await run_verifier(sandbox, task))
        multi = self._multi.get(episode_id) if task.step else None
        after = following(multi, task.step, result) if multi and task.step else None
        if multi is not None and after is not None:  # the next step's setup
            try:
                await start_step(sandbox, multi, after, result)
            except SandboxError as exc:
                raise InfraFailure(FailureKind.START, str(exc)) from exc
        return result


_INSTRUCTION = re.compile(r"^\s*(WORKDIR|COPY|ADD)\s+(.*)$", re.IGNORECASE)


def context_copies(env_dir: Path, workdir: str = "/app") -> list[tuple[Path, str]]:
    """(context path, sandbox path) of each source of the Dockerfile's COPY / ADD lines that
    names a file or directory of the build context; WORKDIR resolves relative destinations.
    Skipped: `--from` copies, heredocs, URLs, globs, $VARs, JSON-form lines, sources outside the
    context (the image's business, which this backend does not build)."""
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

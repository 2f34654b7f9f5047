"""What both backends do before an agent starts, as Harbor does: a task's or a step's healthcheck
(run as Docker runs HEALTHCHECK) and, between a multi-step task's steps, the step's workdir upload,
setup.sh and healthcheck. A step's failure of these is its StepFailed; a sandbox that cannot run
them stays a SandboxError.

Design: docs/sandboxes.md#the-verifier
"""

from __future__ import annotations

import asyncio
import shlex
import time

from stacx.errors import SandboxError
from stacx.harbor.model import Healthcheck
from stacx.ports import Sandbox, StepFailed, Task, Verdict


class Unhealthy(SandboxError):
    """The check ran and kept failing (not: the sandbox could not run it)."""


async def wait_healthy(sandbox: Sandbox, check: Healthcheck) -> None:
    """Until the check passes; Unhealthy (with the last output) if it keeps failing."""
    t0 = time.monotonic()
    failures = 0
    while True:
        result = await sandbox.exec(check.command, timeout=check.timeout_sec)
        if result.exit_code == 0:
            return
        starting = time.monotonic() - t0 < check.start_period_sec
        failures += 0 if starting else 1
        if failures >= max(check.retries, 1):
            tail = (result.stdout + result.stderr).strip()[-500:]
            raise Unhealthy(
                f"healthcheck `{check.command}` failed {failures} time(s) "
                f"(exit {result.exit_code}, timed out: {result.timed_out}): {tail}"
            )
        await asyncio.sleep(check.start_interval_sec if starting else check.interval_sec)


def following(parent: Task, step: str, verdict: Verdict) -> str | None:
    """The step after `step` (verified with `verdict`); None at the last or below its min_reward."""
    names = [s.name for s in parent.config.steps or []]
    i = names.index(step)
    if i + 1 == len(names) or not parent.step_passes(step, verdict):
        return None
    return names[i + 1]


async def start_step(
    sandbox: Sandbox, parent: Task, step: str, verified: Verdict | None = None
) -> None:
    """A step's workdir upload, setup.sh, healthcheck; StepFailed (with `verified`) on failure."""
    config = next(s for s in parent.config.steps or [] if s.name == step)
    view = next(t for t in parent.step_tasks if t.step == step)
    files = parent.dir / "steps" / step / "workdir"
    try:
        if files.is_dir():
            pwd = await sandbox.exec("pwd")
            workdir = pwd.stdout.strip() or "/"
            await sandbox.upload_dir(str(files), workdir)
            if (files / "setup.sh").is_file():
                user = view.config.agent.user
                done = await sandbox.exec(
                    f"bash {shlex.quote(workdir.rstrip('/') + '/setup.sh')}",
                    user=None if user is None else str(user),
                )
                if done.exit_code != 0:  # Harbor's message and exception type
                    raise StepFailed(
                        step,
                        "RuntimeError",
                        (
                            f"Step '{step}' setup.sh exited with code {done.exit_code}: "
                            f"{(done.stderr or done.stdout).strip()[-500:]}"
                        ),
                        verified,
                    )
        if config.healthcheck is not None:
            try:
                await wait_healthy(sandbox, config.healthcheck)
            except Unhealthy as exc:
                raise StepFailed(step, "HealthcheckError", str(exc), verified) from exc
    except SandboxError as exc:
        raise SandboxError(f"step {step!r}: {exc}") from exc

"""What a multi-step task's backends do between its steps, as Harbor does it: before each
step's agent, the step's `steps/<name>/workdir/` is uploaded into the working directory, its
`setup.sh` there (if any) runs from it, then the step's own healthcheck (it supplements the
task's [environment.healthcheck], which ran when the sandbox started). The first step's setup
follows the sandbox's start; a later one follows the previous step's verifier, and only when
that step's min_reward lets the rest run.

Both backends (Docker, process) call these in every rollout. A setup.sh that exits non-zero
or a step healthcheck that keeps failing is that step's failure, as in Harbor's `_run_steps`:
StepFailed (stacx.ports), which the episode runner records and scores from the steps that ran.
The sandbox failing under them (an exec or upload that cannot be done) stays a SandboxError,
START for the episode.
"""

from __future__ import annotations

import shlex

from stacx.errors import SandboxError
from stacx.ports import Sandbox, StepFailed, Task, Verdict
from stacx.sandbox.health import Unhealthy, wait_healthy


def following(parent: Task, step: str, verdict: Verdict) -> str | None:
    """The step that runs after `step` was verified with `verdict`, or None (the last one, or
    its min_reward stops the rest)."""
    names = [s.name for s in parent.config.steps or []]
    i = names.index(step)
    if i + 1 == len(names) or not parent.step_passes(step, verdict):
        return None
    return names[i + 1]


async def start_step(
    sandbox: Sandbox, parent: Task, step: str, verified: Verdict | None = None
) -> None:
    """Step `step`'s workdir upload, setup.sh and healthcheck. StepFailed (carrying
    `verified`, the verdict of the step before) if setup.sh or the check fails; SandboxError if
    the sandbox cannot run them."""
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

"""A task's [environment.healthcheck] and a multi-step task's `steps[].healthcheck`, run as
Docker runs HEALTHCHECK: the command is retried every `interval_sec` (every
`start_interval_sec` during `start_period_sec`, when failures do not count) until it exits 0;
`retries` consecutive counted failures make the sandbox unhealthy. The task's check runs once
the sandbox is up, a step's (stacx.sandbox.steps) right before that step's agent.
"""

from __future__ import annotations

import asyncio
import time

from stacx.errors import SandboxError
from stacx.harbor.model import Healthcheck
from stacx.ports import Sandbox


class Unhealthy(SandboxError):
    """The check ran and kept failing (not: the sandbox could not run it)."""


async def wait_healthy(sandbox: Sandbox, check: Healthcheck) -> int:
    """Return the number of attempts it took; Unhealthy (with the last output) if unhealthy."""
    t0 = time.monotonic()
    failures = attempts = 0
    while True:
        attempts += 1
        result = await sandbox.exec(check.command, timeout=check.timeout_sec)
        if result.exit_code == 0:
            return attempts
        starting = time.monotonic() - t0 < check.start_period_sec
        failures += 0 if starting else 1
        if failures >= max(check.retries, 1):
            tail = (result.stdout + result.stderr).strip()[-500:]
            raise Unhealthy(
                f"healthcheck `{check.command}` failed {failures} time(s) "
                f"(exit {result.exit_code}, timed out: {result.timed_out}): {tail}"
            )
        await asyncio.sleep(check.start_interval_sec if starting else check.interval_sec)

"""A role process whose launcher died ends on its own, even when its stop path cannot finish: the
orphan watch in ``stacx.launch.processes`` asks the loop to stop, then kills the role's process group
``ORPHAN_GRACE_S`` later. Here the role's loop is blocked (a stop that never runs) and the launcher is
a real parent process killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ROLE = textwrap.dedent(
    """
    import asyncio, os, threading, time
    from stacx.launch import processes
    processes.ORPHAN_GRACE_S = 1.0

    async def main():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        threading.Thread(target=processes._end_when_orphaned, args=(loop, stop, int(os.environ['PARENT'])), daemon=True).start()
        time.sleep(600)  # the loop is blocked: stop.set never runs, so only the kill can end this

    asyncio.run(main())
    """
)

LAUNCHER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    env = {**os.environ, "PARENT": str(os.getpid())}
    role = subprocess.Popen([sys.executable, "-c", sys.argv[1]], start_new_session=True, env=env)
    print(role.pid, flush=True)
    time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return "Z" not in stat.read_text().split()[2]
    except OSError:
        return False


def test_a_role_whose_launcher_died_ends_even_when_its_loop_is_stuck() -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, ROLE], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert launcher.stdout is not None
    role = int(launcher.stdout.readline())
    time.sleep(1.0)
    assert _alive(role), "the role ended while its launcher runs"
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 60
    while _alive(role) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = _alive(role)
    if alive:
        os.kill(role, signal.SIGKILL)
    assert not alive, "a role outlived its kill -9'd launcher with its loop stuck"

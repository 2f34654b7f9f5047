"""A run file's launcher pid is live when the process exists, whoever owns it: signalling another
user's process is refused (EPERM), not unknown, so ``stacx run`` must not take over a directory
whose launcher runs as someone else (`stacx.launch.resume.pid_alive`, as the sandbox reaper's
`owner_alive` reads it)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stacx.launch.resume import pid_alive

NOBODY = 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another user needs root")
def test_another_users_process_is_alive_and_an_ended_one_is_not() -> None:
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    assert not pid_alive(ended.pid)
    child = os.fork()
    if child == 0:  # as nobody: this test's process (root's) refuses its signals
        code = 2
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            code = 0 if pid_alive(os.getppid()) else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0

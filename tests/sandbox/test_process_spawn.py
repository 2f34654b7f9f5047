"""The process sandbox never forks the calling process (issue 41, STYLE principle 21): its
commands and sweeps are forked by the sandbox's spawner, which the caller starts by vfork (no
`preexec_fn`). A fork of the caller, the process that holds the engine and CUDA, copies its page
tables under the GIL; these tests fail if one happens on the sandbox's path."""

from __future__ import annotations

import os
import subprocess
import traceback

import pytest

from stacx.sandbox.process import ProcessSandbox
from tests.sandbox.backends import TIGHT, live_processes

_forks: list[str] | None = None  # while a list: every fork of this process, with its stack


def _record_fork() -> None:
    if _forks is not None:
        _forks.append("".join(traceback.format_stack(limit=12)))


os.register_at_fork(before=_record_fork)  # os.fork() and every preexec_fn subprocess call it


@pytest.fixture
def forks() -> list[str]:
    global _forks
    _forks = []
    try:
        yield _forks
    finally:
        _forks = None


def test_the_fork_detector_sees_a_preexec_fn_subprocess(forks: list[str]) -> None:
    # a preexec_fn makes Python fork the caller: the hook above must see it, or the test after
    # this one proves nothing
    subprocess.run(["true"], preexec_fn=lambda: None, check=True)
    assert len(forks) == 1
    subprocess.run(["true"], check=True)  # no preexec_fn: vfork, not seen
    assert len(forks) == 1


async def test_commands_and_sweeps_are_never_forked_from_the_caller(forks: list[str]) -> None:
    async with ProcessSandbox(TIGHT, run_id="test") as sb:
        assert sb._spawner is not None
        result = await sb.exec("echo $PPID")
        # the command's parent is the spawner, not this process
        assert int(result.stdout) == sb._spawner.pid != os.getpid()
        assert (await sb.exec(["true"])).exit_code == 0
        # a timeout: TERM, then KILL of the group, then a sweep of the sandbox's uid
        slow = await sb.exec("trap '' TERM; sleep 30", timeout=0.3)
        assert slow.timed_out
        # a process that left its group, killed by the sweep at close
        await sb.exec("setsid sleep 300 > /dev/null 2>&1 < /dev/null &")
    if sb.uid is not None:
        assert await live_processes(sb) == []
    assert forks == [], "the calling process forked:\n" + "\n".join(forks)


async def test_a_command_that_cannot_start_exits_as_a_shell_says(forks: list[str]) -> None:
    async with ProcessSandbox(TIGHT, run_id="test") as sb:
        missing = await sb.exec(["no-such-program-stacx"])
        assert missing.exit_code == 127
        assert "no-such-program-stacx" in missing.stderr
        not_runnable = await sb.exec(["/etc/hostname"])
        assert not_runnable.exit_code == 126
    assert forks == []


async def test_a_command_inherits_no_spawner_fd_and_no_ignored_signal() -> None:
    async with ProcessSandbox(TIGHT, run_id="test") as sb:
        fds = (await sb.exec(["ls", "/proc/self/fd"])).stdout.split()
        assert fds == ["0", "1", "2", "3"]  # 3: ls's own listing of the dir
        status = (await sb.exec(["grep", "SigIgn", "/proc/self/status"])).stdout
        assert status.split() == ["SigIgn:", "0" * 16]  # Python ignores SIGPIPE; commands must not


async def test_a_dead_spawner_is_replaced_at_the_next_exec() -> None:
    async with ProcessSandbox(TIGHT, run_id="test") as sb:
        assert sb._spawner is not None
        sb._spawner.proc.kill()
        await sb._spawner.proc.wait()
        # the caller learns it at the next exec: the command runs on a new spawner
        result = await sb.exec("echo ok")
        assert result.stdout == "ok\n"


def test_the_spawner_program_imports_nothing_of_stacx() -> None:
    # it runs as `python -S -I -c SOURCE` inside a chroot: a stacx import would fail there
    from stacx.sandbox import spawner

    assert "stacx" not in "".join(
        line for line in spawner.SOURCE.splitlines() if line.startswith(("import", "from"))
    )

"""The Sandbox port's contract, against every backend: Docker (real containers, marked
`docker`) and the process backend (a temp root with rlimits; runs without Docker)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import aiodocker
import pytest

from stacx.ports import Sandbox
from stacx.sandbox.docker import DockerSandbox, Limits
from stacx.sandbox.process import ProcessSandbox, isolation
from tests.sandbox.backends import backend, neighbour, sandbox

__all__ = ["backend", "neighbour", "sandbox"]  # the parametrized fixtures

docker_only = pytest.mark.docker


async def test_exec_separates_streams_and_exit_code(sandbox: Sandbox) -> None:
    r = await sandbox.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, "out\n", "err\n", False)


async def test_exec_argv_env_cwd_user(sandbox: Sandbox) -> None:
    if isinstance(sandbox, ProcessSandbox) and os.geteuid() != 0:
        pytest.skip("the process backend switches users only when STACX runs as root")
    r = await sandbox.exec(
        ["sh", "-c", 'echo "$GREETING $(pwd) $(id -u)"'],
        env={"GREETING": "hi"},
        cwd="/tmp",
        user="nobody",
    )
    assert r.stdout == "hi /tmp 65534\n"


async def test_default_cwd_is_the_image_workdir(sandbox: Sandbox) -> None:
    assert (await sandbox.exec("pwd")).stdout == "/app\n"


async def test_log_dirs_exist_and_are_writable_by_any_user(sandbox: Sandbox) -> None:
    r = await sandbox.exec("touch /logs/verifier/x /logs/agent/y", user="nobody")
    assert r.exit_code == 0, r.stderr


async def test_write_then_read_creates_parents_and_keeps_bytes(sandbox: Sandbox) -> None:
    payload = bytes(range(256)) * 10
    await sandbox.write_file("/tmp/deep/er/blob.bin", payload, mode=0o755)
    assert await sandbox.read_file("/tmp/deep/er/blob.bin") == payload
    r = await sandbox.exec("stat -c '%a' /tmp/deep/er/blob.bin /tmp")
    assert r.stdout.split() == ["755", "1777"]  # and /tmp's sticky mode untouched


async def test_read_missing_file_raises_file_not_found(sandbox: Sandbox) -> None:
    with pytest.raises(FileNotFoundError):
        await sandbox.read_file("/nope/missing.txt")


async def test_upload_dir_copies_tree_and_exec_bits(sandbox: Sandbox, tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("A")
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    await sandbox.upload_dir(str(tmp_path), "/tests/up")
    r = await sandbox.exec("cat /tests/up/sub/a.txt; /tests/up/run.sh; stat -c %a /tests/up")
    assert r.stdout == "Aran\n755\n"


async def test_a_script_writes_the_reward_where_the_verifier_reads_it(sandbox: Sandbox) -> None:
    # test.sh names /logs inside its text: the path must be the sandbox's, not rewritten argv
    await sandbox.write_file("/tests/test.sh", "echo 1 > /logs/verifier/reward.txt\n")
    r = await sandbox.exec(["bash", "/tests/test.sh"])
    assert r.exit_code == 0, r.stderr
    assert await sandbox.read_file("/logs/verifier/reward.txt") == b"1\n"


async def test_exec_with_timeout_reports_it_and_leaves_the_sandbox_usable(
    sandbox: Sandbox,
) -> None:
    r = await sandbox.exec("sleep 30", timeout=0.5)
    assert r.timed_out and r.exit_code is None and r.duration_ms < 10_000
    assert (await sandbox.exec("echo ok", timeout=30)).stdout == "ok\n"


@docker_only
async def test_container_carries_limits_and_owner_labels(
    base_image: str, docker: aiodocker.Docker
) -> None:
    limits = Limits(cpus=1, memory_mb=256, pids=128, allow_internet=False)
    async with await DockerSandbox.create(base_image, limits, docker=docker, run_id="test") as sb:
        info = await docker.containers.get(sb.id)
    labels, host = info["Config"]["Labels"], info["HostConfig"]
    assert labels["stacx.run_id"] == "test"
    assert labels["stacx.pid"] == str(os.getpid())
    assert host["Memory"] == host["MemorySwap"] == 256 << 20
    assert host["PidsLimit"] == 128
    assert host["NanoCpus"] == 10**9
    assert host["NetworkMode"] == "none"


@docker_only
async def test_close_removes_the_container_and_is_idempotent(
    base_image: str, docker: aiodocker.Docker
) -> None:
    sb = await DockerSandbox.create(base_image, Limits(memory_mb=128), docker=docker)
    await sb.close()
    await sb.close()
    with pytest.raises(aiodocker.DockerError) as err:
        await docker.containers.get(sb.id)
    assert err.value.status == 404


async def test_process_commands_carry_the_rlimits() -> None:
    limits = Limits(memory_mb=300, pids=77)
    async with await ProcessSandbox.create(limits) as sb:
        r = await sb.exec("ulimit -v; ulimit -u; ulimit -n", timeout=30)
    assert r.stdout.split() == [str(300 * 1024), "77", "4096"]


async def test_process_close_removes_the_root_and_is_idempotent() -> None:
    sb = await ProcessSandbox.create(Limits())
    assert sb.root is not None
    root = sb.root
    await sb.exec("sleep 600 > /dev/null 2>&1 &")  # a straggler: close() kills it
    await sb.close()
    await sb.close()
    assert not root.exists()
    if sb.uid is not None:
        from stacx.sandbox.containment import live_processes as _live_processes

        assert _live_processes(sb.uid) == []


async def test_process_paths_outside_the_sandbox_are_the_hosts() -> None:
    # documented: only the workdir, /logs, /tests, /solution, /tmp and /home are the sandbox's
    if isolation().isolation != "namespaces":
        pytest.skip("no mount namespace here")
    async with await ProcessSandbox.create(Limits()) as sb:
        r = await sb.exec(["cat", "/etc/hostname"])
    assert r.stdout == Path("/etc/hostname").read_text()  # noqa: ASYNC240

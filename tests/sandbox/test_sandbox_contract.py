"""The Sandbox protocol, against the Docker backend (real containers)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import aiodocker
import pytest

from stacx.sandbox.docker import DockerSandbox, Limits

pytestmark = pytest.mark.docker


async def test_exec_separates_streams_and_exit_code(sandbox: DockerSandbox) -> None:
    r = await sandbox.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, "out\n", "err\n", False)


async def test_exec_argv_env_cwd_user(sandbox: DockerSandbox) -> None:
    r = await sandbox.exec(
        ["sh", "-c", 'echo "$GREETING $(pwd) $(id -u)"'],
        env={"GREETING": "hi"},
        cwd="/tmp",
        user="nobody",
    )
    assert r.stdout == "hi /tmp 65534\n"


async def test_default_cwd_is_the_image_workdir(sandbox: DockerSandbox) -> None:
    assert (await sandbox.exec("pwd")).stdout == "/app\n"


async def test_log_dirs_exist_and_are_writable_by_any_user(sandbox: DockerSandbox) -> None:
    r = await sandbox.exec("touch /logs/verifier/x /logs/agent/y", user="nobody")
    assert r.exit_code == 0, r.stderr


async def test_write_then_read_creates_parents_and_keeps_bytes(sandbox: DockerSandbox) -> None:
    payload = bytes(range(256)) * 10
    await sandbox.write_file("/tmp/deep/er/blob.bin", payload, mode=0o755)
    assert await sandbox.read_file("/tmp/deep/er/blob.bin") == payload
    r = await sandbox.exec("stat -c '%a' /tmp/deep/er/blob.bin /tmp")
    assert r.stdout.split() == ["755", "1777"]  # and /tmp's sticky mode untouched


async def test_read_missing_file_raises_file_not_found(sandbox: DockerSandbox) -> None:
    with pytest.raises(FileNotFoundError):
        await sandbox.read_file("/nope/missing.txt")


async def test_upload_dir_copies_tree_and_exec_bits(sandbox: DockerSandbox, tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("A")
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    await sandbox.upload_dir(str(tmp_path), "/opt/up")
    r = await sandbox.exec("cat /opt/up/sub/a.txt; /opt/up/run.sh; stat -c %a /opt/up")
    assert r.stdout == "Aran\n755\n"


async def test_container_carries_limits_and_owner_labels(
    sandbox: DockerSandbox, docker: aiodocker.Docker
) -> None:
    info = await docker.containers.get(sandbox.id)
    labels, host = info["Config"]["Labels"], info["HostConfig"]
    assert labels["stacx.run_id"] == "test"
    assert labels["stacx.pid"] == str(os.getpid())
    assert host["Memory"] == host["MemorySwap"] == 256 << 20
    assert host["PidsLimit"] == 128
    assert host["NanoCpus"] == 10**9
    assert host["NetworkMode"] == "none"


async def test_close_removes_the_container_and_is_idempotent(
    base_image: str, docker: aiodocker.Docker
) -> None:
    sb = await DockerSandbox.create(base_image, Limits(memory_mb=128), docker=docker)
    await sb.close()
    await sb.close()
    with pytest.raises(aiodocker.DockerError) as err:
        await docker.containers.get(sb.id)
    assert err.value.status == 404

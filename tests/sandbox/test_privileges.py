"""What a task may ask of the hardened sandbox ([environment.stacx], stacx.sandbox.privileges),
on real containers: a declared capability works, read-only root keeps Harbor's paths
writable, a bad capability name or runtime is an error naming the accepted values, and
`stacx tasks check` lists the tasks that ask for more."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest

from stacx.errors import ConfigError, TaskError
from stacx.harbor.tasks import load_task
from stacx.ports import Limits
from stacx.sandbox.docker import DockerSandbox, container_config
from stacx.sandbox.limits import task_limits

RAW = "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); print(\"raw ok\")'"


def _task(root: Path, base_image: str, extra: str, name: str = "t") -> Path:
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "solution").mkdir()
    (d / "instruction.md").write_text("Nothing.\n")
    (d / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (d / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
    (d / "environment" / "Dockerfile").write_text(f"FROM {base_image}\nWORKDIR /app\n")
    (d / "task.toml").write_text(
        textwrap.dedent("""\
        version = "1.0"
        [environment]
        memory_mb = 256
        allow_internet = false
        """)
        + extra
    )
    return d


def test_a_bad_capability_name_is_an_error_naming_the_key(tmp_path: Path) -> None:
    d = _task(tmp_path, "x", '[environment.stacx]\ncap_add = ["NET_RAWW"]\n')
    with pytest.raises(
        TaskError, match=r"environment.stacx.cap_add: \['NET_RAWW'\].*accepted: .*NET_RAW"
    ):
        load_task(d)


def test_the_runtime_is_checked_and_passed_to_docker() -> None:
    host = container_config("img", Limits(), {}, "runsc")["HostConfig"]
    assert host["Runtime"] == "runsc"  # type: ignore[index]
    assert "Runtime" not in container_config("img", Limits(), {}, "runc")["HostConfig"]  # type: ignore[operator]
    with pytest.raises(TaskError, match="accepted values are runc, runsc"):
        container_config("img", Limits(), {}, "kata")
    from stacx.launch.loader import convert

    with pytest.raises((ConfigError, msgspec.ValidationError), match="runtime"):
        convert({"sandbox": {"runtime": "kata"}})


@pytest.mark.docker
async def test_declared_capability_and_setuid_work_only_when_declared(
    base_image: str, tmp_path: Path
) -> None:
    plain = task_limits(load_task(_task(tmp_path, base_image, "", "plain")))
    more = task_limits(
        load_task(
            _task(
                tmp_path,
                base_image,
                textwrap.dedent("""\
        [environment.stacx]
        cap_add = ["NET_RAW"]
        new_privileges = true
        """),
                "more",
            )
        )
    )
    assert more.cap_add == ["NET_RAW"] and more.new_privileges
    setuid = (
        'cp "$(readlink -f "$(command -v python3)")" /tmp/s && chmod 4755 /tmp/s && '
        "su nobody -s /bin/sh -c \"/tmp/s -c 'import os; print(os.geteuid())'\""
    )
    seen = {}
    for name, limits in (("plain", plain), ("more", more)):
        async with await DockerSandbox.create(base_image, limits, run_id="priv") as sb:
            seen[name] = (
                (await sb.exec(RAW, timeout=30)).stdout,
                (await sb.exec(setuid, timeout=30)).stdout.strip(),
            )
    assert seen == {"plain": ("", "65534"), "more": ("raw ok\n", "0")}


@pytest.mark.docker
async def test_read_only_root_keeps_harbors_paths_writable(base_image: str, tmp_path: Path) -> None:
    limits = task_limits(
        load_task(_task(tmp_path, base_image, "[environment.stacx]\nread_only_root = true\n"))
    )
    async with await DockerSandbox.create(base_image, limits, run_id="ro") as sb:
        root = await sb.exec("touch /app/x /etc/x", timeout=30)
        ok = await sb.exec("touch /tmp/x /logs/verifier/x /logs/agent/x && echo ok", timeout=30)
        await sb.upload_dir(str(tmp_path / "t" / "tests"), "/tests")
        listed = await sb.exec("ls /tests", timeout=30)
    assert root.exit_code != 0 and "Read-only file system" in root.stderr
    assert ok.stdout == "ok\n", ok
    assert listed.stdout.split() == ["test.sh"]


@pytest.mark.docker
def test_tasks_check_lists_the_tasks_that_ask_for_more(base_image: str, tmp_path: Path) -> None:
    tasks = tmp_path / "set"
    _task(tasks, base_image, "", "plain")
    _task(tasks, base_image, '[environment.stacx]\ncap_add = ["NET_RAW", "CHOWN"]\n', "pinger")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stacx",
            "tasks",
            "check",
            str(tasks),
            "--agent",
            "oracle",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("privileges:")]
    assert lines == ["privileges: task pinger asks for cap_add NET_RAW"], proc.stdout

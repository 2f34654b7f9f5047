"""Task images: built through the alias map, cached by content hash, failures named."""

from __future__ import annotations

from pathlib import Path

import aiodocker
import pytest

from stacx.errors import TaskError
from stacx.harbor.tasks import load_task
from stacx.sandbox.aliases import AliasMap
from stacx.sandbox.build import build_task_image
from stacx.sandbox.docker import DockerSandbox
from stacx.sandbox.images import bootstrap_base_image
from stacx.sandbox.limits import task_limits

from .conftest import make_task

pytestmark = pytest.mark.docker

DOCKERFILE = "FROM docker.io/library/python:3.11-slim\nWORKDIR /app\nCOPY data/ /app/data/\n"


async def test_image_is_cached_by_content_hash(
    tmp_path: Path, base_image: str, docker: aiodocker.Docker
) -> None:
    d = make_task(
        tmp_path,
        "cached",
        test_sh="true",
        dockerfile=DOCKERFILE,
        files={"environment/data/x.txt": "1"},
    )
    logs: list[str] = []
    tag1 = await build_task_image(load_task(d), docker, AliasMap(), log=logs.append)
    tag2 = await build_task_image(load_task(d), docker, AliasMap(), log=logs.append)
    assert tag1 == tag2 and tag1.startswith("stacx/task-cached:")
    assert len(logs) == 1  # built once; the second call found the tag
    (d / "environment" / "data" / "x.txt").write_text("2")
    tag3 = await build_task_image(load_task(d), docker, AliasMap(), log=logs.append)
    assert tag3 != tag1
    info = await docker.images.inspect(tag3)
    assert info["Config"]["WorkingDir"] == "/app"
    for tag in (tag1, tag3):
        await docker.images.delete(tag, force=True)


async def test_unresolvable_base_fails_naming_image_and_task(
    tmp_path: Path, docker: aiodocker.Docker
) -> None:
    d = make_task(tmp_path, "needs-node", test_sh="true", dockerfile="FROM node:20-alpine\n")
    with pytest.raises(TaskError, match=r"task needs-node: base image 'node:20-alpine'"):
        await build_task_image(load_task(d), docker, AliasMap())


async def test_failing_build_reports_the_log_tail(
    tmp_path: Path, base_image: str, docker: aiodocker.Docker
) -> None:
    d = make_task(
        tmp_path,
        "broken-build",
        test_sh="true",
        dockerfile="FROM debian:bookworm\nRUN echo about-to-fail && exit 7\n",
    )
    with pytest.raises(TaskError, match=r"(?s)broken-build: image build failed.*about-to-fail"):
        await build_task_image(load_task(d), docker, AliasMap())


def test_bootstrap_is_idempotent_when_the_image_exists(base_image: str) -> None:
    logs: list[str] = []
    assert bootstrap_base_image(log=logs.append) is False
    assert "nothing to do" in logs[0]


async def test_image_entrypoint_runs_with_the_sandboxs_command_instead_of_cmd(
    tmp_path: Path, base_image: str, docker: aiodocker.Docker
) -> None:
    """As Harbor starts `main`: the image's ENTRYPOINT (here one that starts a service, then
    execs its arguments) runs; the image's CMD does not (the sandbox's sleep replaces it)."""
    entrypoint = '#!/bin/sh\necho service-up > /tmp/service\nexec "$@"\n'
    d = make_task(
        tmp_path,
        "with-entrypoint",
        test_sh="true",
        dockerfile="FROM debian:bookworm\nCOPY entrypoint.sh /entrypoint.sh\n"
        'RUN chmod +x /entrypoint.sh\nENTRYPOINT ["/entrypoint.sh"]\n'
        'CMD ["sh", "-c", "echo cmd-ran > /tmp/cmd"]\n',
        files={"environment/entrypoint.sh": entrypoint},
    )
    task = load_task(d)
    image = await build_task_image(task, docker, AliasMap())
    async with await DockerSandbox.create(image, task_limits(task), docker=docker) as sb:
        wait = "until [ -s /tmp/service ]; do sleep 0.05; done; cat /tmp/service"  # it races us
        assert (await sb.exec(wait, timeout=60)).stdout == "service-up\n"
        assert (await sb.exec("test -e /tmp/cmd")).exit_code == 1
        assert "sleep infinity" in (await sb.exec("cat /proc/*/cmdline | tr '\\0' ' '")).stdout

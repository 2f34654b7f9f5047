"""`stacx sandbox gc`: containers whose owning process is gone are removed, live ones kept."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap

import aiodocker
import pytest

from stacx.sandbox.docker import DockerSandbox, Limits
from stacx.sandbox.gc import collect_garbage, list_sandboxes

pytestmark = pytest.mark.docker

ORPHAN_MAKER = textwrap.dedent(
    """
    import asyncio, os
    from stacx.sandbox.docker import DockerSandbox, Limits
    async def main():
        sb = await DockerSandbox.create(%r, Limits(memory_mb=64), run_id="gc-orphan-run")
        print(sb.id, flush=True)
        os._exit(0)  # dies without closing: the container is orphaned
    asyncio.run(main())
    """
)


async def _orphan(image: str, docker: aiodocker.Docker) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", ORPHAN_MAKER % image, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    return out.decode().strip()


async def test_gc_removes_orphans_and_keeps_live_sandboxes(
    base_image: str, docker: aiodocker.Docker
) -> None:
    async with await DockerSandbox.create(
        base_image, Limits(memory_mb=64), docker=docker, run_id="gc-live-run"
    ) as live:
        # a sandbox service started by a test beside this one sweeps the whole host at its start
        # and every minute: an orphan it takes first is gone, as it should be, but not our sweep's
        # doing, so make another until this test's own sweep is the one that removes it
        for _ in range(5):
            orphan_id = await _orphan(base_image, docker)
            listed = {s.run_id: s for s in await list_sandboxes(docker)}
            assert listed["gc-live-run"].alive is True
            if "gc-orphan-run" in listed:
                assert listed["gc-orphan-run"].alive is False
                removed = await collect_garbage(docker)
                assert live.id[:12] not in [s.id for s in removed]
                if orphan_id[:12] in [s.id for s in removed]:
                    break
            with pytest.raises(aiodocker.DockerError):  # swept by another collector
                await docker.containers.get(orphan_id)
        else:
            pytest.fail("five orphans in a row were swept by another collector before this one")
        assert (await live.exec("echo still")).stdout == "still\n"
        # the CLI lists it with its run and a live owner
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "stacx",
            "sandbox",
            "ls",
            "--format",
            "json",
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await proc.communicate()
        rows = [json.loads(line) for line in out.decode().splitlines()]
        assert {"run_id": "gc-live-run", "owner": "alive"}.items() <= next(
            r for r in rows if r["id"] == live.id[:12]
        ).items()
    with pytest.raises(aiodocker.DockerError):
        await docker.containers.get(orphan_id)


EGRESS_ORPHAN_MAKER = textwrap.dedent(
    """
    import asyncio, os
    import aiodocker
    from stacx.sandbox.docker import owner_labels
    from stacx.sandbox.egress import Egress
    async def main():
        docker = aiodocker.Docker()
        await Egress.start(docker, "stacx-gc-egress-test", [], owner_labels("gc-egress-run"))
        os._exit(0)  # dies without closing: the network and the proxy are orphaned
    asyncio.run(main())
    """
)


async def test_gc_removes_an_orphaned_allowlist_network_and_its_proxy(
    base_image: str, docker: aiodocker.Docker
) -> None:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", EGRESS_ORPHAN_MAKER)
    assert await proc.wait() == 0
    await docker.networks.get("stacx-gc-egress-test")  # there
    removed = await collect_garbage(docker, run_id="gc-egress-run")
    assert [s.name for s in removed] == ["stacx-gc-egress-test-proxy"]
    with pytest.raises(aiodocker.DockerError):
        await docker.networks.get("stacx-gc-egress-test")


VOLUME_ORPHAN_MAKER = textwrap.dedent(
    """
    import asyncio, os
    import aiodocker
    from stacx.sandbox.compose import Mount, Service, create_volumes
    from stacx.sandbox.docker import owner_labels
    async def main():
        docker = aiodocker.Docker()
        services = {"a": Service(name="a", mounts=[Mount(source="shared", target="/s",
                                                         volume=True)])}
        await create_volumes(docker, services, "stacx-gc-volume-test",
                             owner_labels("gc-volume-run"))
        os._exit(0)  # dies without removing it: the compose volume is orphaned
    asyncio.run(main())
    """
)


async def test_gc_removes_an_orphaned_compose_volume(docker: aiodocker.Docker) -> None:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", VOLUME_ORPHAN_MAKER)
    assert await proc.wait() == 0
    volume = await docker.volumes.get("stacx-gc-volume-test-shared")  # there, labeled
    assert (await volume.show())["Labels"]["stacx.run_id"] == "gc-volume-run"
    await collect_garbage(docker)  # its owner is gone: an orphan
    with pytest.raises(aiodocker.DockerError):
        await docker.volumes.get("stacx-gc-volume-test-shared")

"""A scaffold layer (stacx.sandbox.layers) is built over a task's base when its tag is missing: a
fresh layer here (a unique RUN line, so no earlier build can stand in for it) builds on real
Docker, carries its labels and holds what its RUN wrote; a second call finds it built."""

from __future__ import annotations

import uuid

import aiodocker
import pytest

from stacx.sandbox.layers import ImageLayer, layered_image

pytestmark = pytest.mark.docker


async def test_a_missing_layer_is_built_over_its_base(base_image: str) -> None:
    marker = uuid.uuid4().hex
    layer = ImageLayer(name="layer-test", run=[f"echo {marker} > /layer-marker"])
    async with aiodocker.Docker() as docker:
        tag = await layered_image(docker, base_image, layer)
        try:
            info = await docker.images.inspect(tag)
            assert info["Config"]["Labels"]["stacx.scaffold"] == "layer-test"
            assert await layered_image(docker, base_image, layer) == tag  # found, not rebuilt
            container = await docker.containers.run({"Image": tag, "Cmd": ["cat", "/layer-marker"]})
            try:
                await container.wait()
                out = "".join(await container.log(stdout=True))
            finally:
                await container.delete(force=True)
            assert out.strip() == marker
        finally:
            await docker.images.delete(tag, force=True)

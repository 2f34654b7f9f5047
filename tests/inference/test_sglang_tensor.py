"""SGLang's tensor and distributed weight-update endpoints, against a test double in another
process that follows the real server (sgl-project/sglang main as stored, 0.5.x;
``entrypoints/http_server.py`` + ``managers/io_struct.py``; the package cannot be installed here):

- ``/update_weights_from_tensor``: the body's fields are UpdateWeightsFromTensorReqInput's; the
  double decodes ``serialized_named_tensors[tp_rank]`` as SGLang's
  ``MultiprocessingSerializer.deserialize`` does (base64, then torch's ForkingPickler) into
  ``[(name, tensor)]`` and loads them into a real TorchEngine;
- ``/init_weights_update_group``: the double joins the group as ``rank_offset + tp_rank`` the way
  SGLang's ``init_custom_process_group`` does (TCP rendezvous, prefix store, a new group; gloo
  here, NCCL on GPUs);
- ``/update_weights_from_distributed``: for each (name, dtype, shape) the double receives a
  broadcast from rank 0 into ``torch.empty(shape, dtype=getattr(torch, dtype))``, then loads;
- answers ``{success, message}``, HTTP 400 when ``success`` is false; ``/get_weights_by_name``
  returns ``param.float().tolist()[:truncate_size]``.

(On CPU the tensors travel as torch's shared-memory file descriptors, which a process spawned by
this one can open; real SGLang is sent CUDA tensors, whose IPC handles it maps.)
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import multiprocessing as mp
import socket
import time
import urllib.request
from multiprocessing.reduction import ForkingPickler

import pytest
import torch

from stacx.errors import EngineError
from stacx.inference.sglang_client import (
    SGLangEngine,
    StateNotAccepted,
    distributed_update_request,
    tensor_update_request,
)
from tests.train.test_checkpoint import tiny_model

# the request dataclasses' fields, as io_struct.py declares them (required ones first)
TENSOR_FIELDS = (
    {"serialized_named_tensors"},
    {"load_format", "flush_cache", "abort_all_requests", "weight_version", "disable_draft_model"},
)
GROUP_FIELDS = (
    {"master_address", "master_port", "rank_offset", "world_size"},
    {"group_name", "backend"},
)
DISTRIBUTED_FIELDS = (
    {"names", "dtypes", "shapes"},
    {"group_name", "flush_cache", "abort_all_requests", "weight_version", "load_format"},
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _double(port: int) -> None:
    """The SGLang double: an aiohttp app over a real TorchEngine (tp_size 1)."""
    from aiohttp import web
    from torch.distributed import distributed_c10d as c10d

    from stacx.inference.torch_engine import TorchEngine

    engine = TorchEngine(tiny_model(2), device="cpu", cuda_graphs=False)
    groups: dict[str, object] = {}

    def answer(ok: bool, message: str) -> web.Response:
        return web.json_response({"success": ok, "message": message}, status=200 if ok else 400)

    async def body_of(request: web.Request, fields: tuple[set[str], set[str]]) -> dict:
        body = await request.json()
        required, optional = fields
        if not required <= body.keys() or not body.keys() <= required | optional:
            raise web.HTTPBadRequest(text=f"fields {sorted(body)} are not {fields}")
        return body

    async def update_from_tensor(request: web.Request) -> web.Response:
        body = await body_of(request, TENSOR_FIELDS)
        data = base64.b64decode(body["serialized_named_tensors"][0], validate=True)
        named = ForkingPickler.loads(data)
        try:
            await engine.load_state(dict(named), int(body["weight_version"]))
        except EngineError as e:
            return answer(False, f"Failed to update weights: {e}.")
        return answer(True, "Succeeded to update model weights.")

    async def init_group(request: web.Request) -> web.Response:
        body = await body_of(request, GROUP_FIELDS)
        timeout = datetime.timedelta(seconds=60)

        def join() -> object:  # SGLang's init_custom_process_group
            url = f"tcp://{body['master_address']}:{body['master_port']}"
            store, rank, world = next(
                c10d.rendezvous(url, body["rank_offset"], body["world_size"], timeout=timeout)
            )
            store = c10d.PrefixStore(body["group_name"], store)
            pg, _ = c10d._new_process_group_helper(
                world,
                rank,
                [],
                body["backend"],
                store,
                group_name=body["group_name"],
                timeout=timeout,
            )
            c10d._world.pg_group_ranks[pg] = {i: i for i in range(world)}
            return pg

        groups[body["group_name"]] = await asyncio.to_thread(join)
        return answer(True, "Succeeded to initialize custom process group.")

    async def update_from_distributed(request: web.Request) -> web.Response:
        body = await body_of(request, DISTRIBUTED_FIELDS)
        group = groups[body["group_name"]]

        def receive() -> dict[str, torch.Tensor]:
            out = {}
            for name, dtype, shape in zip(
                body["names"], body["dtypes"], body["shapes"], strict=True
            ):
                w = torch.empty(shape, dtype=getattr(torch, dtype))
                torch.distributed.broadcast(w, src=0, group=group)
                out[name] = w
            return out

        state = await asyncio.to_thread(receive)
        await engine.load_state(state, int(body["weight_version"]))
        return answer(True, "Succeeded to update parameter online.")

    async def get_weights_by_name(request: web.Request) -> web.Response:
        body = await request.json()
        param = engine.model.state_dict()[body["name"]]
        return web.json_response(param.float().tolist()[: body.get("truncate_size", 100)])

    async def health(_request: web.Request) -> web.Response:
        return web.Response(status=200)

    app = web.Application(client_max_size=2**30)
    app.router.add_post("/update_weights_from_tensor", update_from_tensor)
    app.router.add_post("/init_weights_update_group", init_group)
    app.router.add_post("/update_weights_from_distributed", update_from_distributed)
    app.router.add_route("*", "/get_weights_by_name", get_weights_by_name)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


@pytest.fixture(scope="module")
def server() -> object:
    port = _free_port()
    proc = mp.get_context("spawn").Process(target=_double, args=(port,), daemon=True)
    proc.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    yield url
    proc.kill()
    proc.join(10)


def _state(seed: int) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in tiny_model(seed).named_parameters()}


async def _served(client: SGLangEngine, name: str) -> torch.Tensor:
    rows = await client.http.request(
        "POST", "/get_weights_by_name", {"name": name, "truncate_size": 10**6}
    )
    return torch.tensor(rows)


def test_update_weights_from_tensor(server: str) -> None:
    state = _state(1)
    body = tensor_update_request(state, 3)
    assert set(body) <= TENSOR_FIELDS[0] | TENSOR_FIELDS[1] and body["weight_version"] == "3"
    client = SGLangEngine(server)

    async def go() -> None:
        await client.update_weights_from_tensor(state, 3)
        for name, tensor in state.items():
            torch.testing.assert_close(await _served(client, name), tensor, rtol=0, atol=0)
        assert client.weight_version == 3
        bad = {"model.norm.weight": torch.ones(7)}  # a shape the model does not have
        with pytest.raises(EngineError, match="shape mismatch"):
            await client.update_weights_from_tensor(bad, 4)
        assert client.weight_version == 3
        if not torch.cuda.is_available():  # the recipe path: CUDA IPC, else WeightSync's file
            with pytest.raises(StateNotAccepted):
                await client.load_state(state, 4)
        await client.close()

    asyncio.run(go())


def test_update_weights_from_distributed(server: str) -> None:
    state = _state(3)
    body = distributed_update_request(state, 5)
    assert set(body) <= DISTRIBUTED_FIELDS[0] | DISTRIBUTED_FIELDS[1]
    assert body["dtypes"][0] == "float32" and body["names"] == list(state)
    client = SGLangEngine(server)

    async def go() -> None:
        group = await client.init_weights_update_group(
            master_address="127.0.0.1",
            master_port=_free_port(),
            world_size=2,
            backend="gloo",
            timeout_s=60,
        )
        await client.update_weights_from_distributed(state, 5, group)
        for name, tensor in state.items():
            torch.testing.assert_close(await _served(client, name), tensor, rtol=0, atol=0)
        assert client.weight_version == 5
        await client.close()

    asyncio.run(go())

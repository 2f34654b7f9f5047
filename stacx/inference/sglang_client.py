"""An :class:`Engine` backed by an SGLang server's native API (or by `stacx serve`).

Speaks ``POST /generate`` with ``input_ids`` and ``return_logprob`` (token in, token out; no
re-tokenization), the three weight-update paths of SGLang (disk, tensor, distributed), its LoRA
adapter routes, ``POST /flush_cache`` and ``GET /health``. Guarantees: ``output_ids`` are the
server's; a partial checkpoint is refused, never half-loaded; a state it cannot hand over
(no CUDA) raises :class:`StateNotAccepted`, so the caller loads the file instead.

Specification: docs/engine.md#the-sglang-client
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import io
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from safetensors import safe_open

from stacx.errors import EngineError
from stacx.inference.http import HttpClient
from stacx.ports import Generation, SamplingParams

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


def sglang_sampling_params(params: SamplingParams, *, grammars: bool = False) -> dict[str, object]:
    """SGLang's ``sampling_params`` for ``params``. A grammar (llguidance's Lark form) goes as
    ``ebnf`` only to a server known to read that form (``grammars``: the engine role's own
    server, or an SGLang server run with ``--grammar-backend llguidance``); otherwise it is
    refused, never dropped."""
    if params.grammar and not grammars:
        raise EngineError(
            "constrained decoding (SamplingParams.grammar) needs a server that reads llguidance's "
            "Lark grammars (the engine role's, or SGLang with --grammar-backend llguidance)"
        )
    out: dict[str, object] = {
        "max_new_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "stop_token_ids": list(params.stop_token_ids),
        "ignore_eos": params.ignore_eos,
    }
    if params.seed is not None:
        out["sampling_seed"] = params.seed
    if params.grammar:
        out["ebnf"] = params.grammar
    return out


def disk_update_request(path: str, version: int) -> dict[str, object]:
    """The body of SGLang's ``/update_weights_from_disk`` for weights at ``path`` (see
    docs/engine.md#the-sglang-client): the checkpoint's directory when it is a loadable HF one."""
    target = Path(path)
    model_path = str(target)
    if target.is_file() and target.suffix == ".safetensors":
        with safe_open(str(target), framework="pt") as f:
            if (f.metadata() or {}).get("partial") == "1":
                raise EngineError(
                    f"{target} holds only the trained tensors (trainer.trainable): SGLang "
                    "loads full model directories; train every parameter to sync to SGLang"
                )
        if (target.parent / "config.json").is_file():
            model_path = str(target.parent)
    return {
        "model_path": model_path,
        "weight_version": str(version),
        "abort_all_requests": False,
        "flush_cache": True,
    }


class StateNotAccepted(EngineError):
    """These tensors cannot be sent to the server (no GPU to share them from): use the file."""


UPDATE_GROUP = "weight_update_group"  # SGLang's default group_name


def lora_name(version: int) -> str:
    """The name a LoRA weight version is loaded under (SGLang's ``lora_name``)."""
    return f"stacx-v{version}"


def lora_load_request(path: str, version: int) -> dict[str, object]:
    """SGLang's ``LoadLoRAAdapterReqInput{lora_name, lora_path, pinned=False}``: ``path`` is a
    PEFT adapter directory the server can read."""
    return {"lora_name": lora_name(version), "lora_path": path, "pinned": False}


def serialize_named_tensors(state: Mapping[str, torch.Tensor]) -> str:
    """``list[(name, tensor)]`` as SGLang's ``MultiprocessingSerializer.serialize(obj,
    output_str=True)`` writes it: torch's ForkingPickler reductions (a CUDA tensor becomes its
    IPC handle, no bytes of the tensor), base64."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers torch's reductions on ForkingPickler)

    buf = io.BytesIO()
    ForkingPickler(buf).dump(list(state.items()))
    return base64.b64encode(buf.getvalue()).decode("utf-8")


def tensor_update_request(
    state: Mapping[str, torch.Tensor], version: int, *, tp_size: int = 1
) -> dict[str, object]:
    """The body of ``/update_weights_from_tensor`` (one serialized entry per TP rank)."""
    entry = serialize_named_tensors(state)
    return {
        "serialized_named_tensors": [entry] * tp_size,
        "load_format": None,
        "flush_cache": True,
        "abort_all_requests": False,
        "weight_version": str(version),
    }


def init_group_request(
    *,
    master_address: str,
    master_port: int,
    rank_offset: int,
    world_size: int,
    group_name: str = UPDATE_GROUP,
    backend: str = "nccl",
) -> dict[str, object]:
    """The body of ``/init_weights_update_group``: the server's TP ranks join as
    ``rank_offset + tp_rank`` of a group of ``world_size`` whose rank 0 is the sender."""
    return {
        "master_address": master_address,
        "master_port": master_port,
        "rank_offset": rank_offset,
        "world_size": world_size,
        "group_name": group_name,
        "backend": backend,
    }


def distributed_update_request(
    state: Mapping[str, torch.Tensor], version: int, *, group_name: str = UPDATE_GROUP
) -> dict[str, object]:
    """The body of ``/update_weights_from_distributed``: what the sender will broadcast, in
    order (dtype names as ``getattr(torch, name)`` reads them)."""
    return {
        "names": list(state),
        "dtypes": [str(t.dtype).removeprefix("torch.") for t in state.values()],
        "shapes": [list(t.shape) for t in state.values()],
        "group_name": group_name,
        "flush_cache": True,
        "abort_all_requests": False,
        "weight_version": str(version),
    }


def join_update_group(
    *,
    master_address: str,
    master_port: int,
    world_size: int,
    rank: int = 0,
    group_name: str = UPDATE_GROUP,
    backend: str = "nccl",
    timeout_s: float = 600.0,
) -> ProcessGroup:
    """Join a weight-update group the way SGLang's ``init_custom_process_group`` does (a TCP
    rendezvous at ``master_address:master_port``, a prefix store named ``group_name``, a new
    process group beside any default one). Blocks until all ``world_size`` ranks joined."""
    from torch.distributed import distributed_c10d as c10d

    timeout = datetime.timedelta(seconds=timeout_s)
    url = f"tcp://{master_address}:{master_port}"
    store, rank, world_size = next(c10d.rendezvous(url, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = c10d.PrefixStore(group_name, store)
    pg, _ = c10d._new_process_group_helper(
        world_size,
        rank,
        [],
        backend,
        store,
        group_name=group_name,  # type: ignore[arg-type]
        timeout=timeout,
    )
    c10d._world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def broadcast_state(state: Mapping[str, torch.Tensor], group: ProcessGroup) -> None:
    """Rank 0's side of ``/update_weights_from_distributed``: each tensor, in order."""
    import torch.distributed as dist

    for tensor in state.values():
        dist.broadcast(tensor.contiguous(), src=0, group=group)


class SGLangEngine:
    name = "sglang"

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float | None = None,
        weight_version: int = 0,
        retries: int = 3,
        grammars: bool = False,
    ) -> None:
        """``retries``: attempts after a refused connection (nothing was sent), with backoff
        from 0.5 s doubling to 4 s. ``grammars``: the server reads llguidance's Lark grammars
        (see :func:`sglang_sampling_params`), so the gateway may constrain through it."""
        self.http = HttpClient(base_url, timeout_s=timeout_s, retries=retries)
        self.grammars = grammars
        self._version = weight_version
        self._lora: str | None = None  # the adapter generations use (load_adapter)

    @property
    def weight_version(self) -> int:
        return self._version

    def _parse(self, item: object) -> Generation:
        if not isinstance(item, dict) or not isinstance(item.get("meta_info"), dict):
            raise EngineError(f"unexpected /generate answer: {str(item)[:300]}")
        meta = item["meta_info"]
        pairs = meta.get("output_token_logprobs") or []
        ids = item.get("output_ids")
        if ids is None:  # older servers: ids only inside the logprob triples
            ids = [int(p[1]) for p in pairs]
        logprobs = [float(p[0]) for p in pairs] if pairs or not ids else None
        if logprobs is not None and len(logprobs) != len(ids):
            raise EngineError(f"server returned {len(ids)} ids but {len(logprobs)} logprobs")
        fr = meta.get("finish_reason")
        kind = fr.get("type") if isinstance(fr, dict) else fr
        version = self._version
        try:  # with an adapter, the server's weight_version is its base's: ours says more
            version = version if self._lora else int(meta.get("weight_version"))
        except (TypeError, ValueError):
            pass
        return Generation(
            output_ids=[int(t) for t in ids],
            logprobs=logprobs,
            finish_reason=_FINISH.get(str(kind), "abort"),
            weight_version=version,
            gen_ms=float(meta.get("e2e_latency") or 0.0) * 1e3,
        )

    async def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        if not prompts:
            return []
        body = {
            "input_ids": [list(p) for p in prompts],
            "sampling_params": sglang_sampling_params(params, grammars=self.grammars),
            "return_logprob": True,
        }
        if self._lora is not None:
            body["lora_path"] = [self._lora] * len(prompts)
        answer = await self.http.request("POST", "/generate", body)
        items = answer if isinstance(answer, list) else [answer]
        if len(items) != len(prompts):
            raise EngineError(f"/generate answered {len(items)} results for {len(prompts)} prompts")
        return [self._parse(item) for item in items]

    async def score(self, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
        if not prompt_ids or not output_ids:
            raise EngineError("score needs a non-empty prompt and a non-empty output")
        body = {
            "input_ids": list(prompt_ids) + list(output_ids),
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_logprob": True,
            "logprob_start_len": len(prompt_ids),
        }
        if self._lora is not None:
            body["lora_path"] = self._lora
        answer = await self.http.request("POST", "/generate", body, idempotent=True)  # a read
        meta = answer.get("meta_info", {}) if isinstance(answer, dict) else {}
        triples = meta.get("input_token_logprobs") or []
        tail = triples[-len(output_ids) :]
        if len(tail) != len(output_ids) or any(t[0] is None for t in tail):
            raise EngineError(
                f"/generate returned {len(triples)} input logprobs, need {len(output_ids)}"
            )
        if [int(t[1]) for t in tail] != list(output_ids):
            raise EngineError("input_token_logprobs do not line up with the scored ids")
        return [float(t[0]) for t in tail]

    async def load_adapter(
        self, path: str, version: int, state: Mapping[str, torch.Tensor] | None = None
    ) -> None:
        """`LoadsAdapter`: ``/load_lora_adapter`` of the adapter directory (read by the SERVER:
        ``state`` is not sent), then every generation names it in ``lora_path``; the previous
        adapter is unloaded after (SGLang lets requests in flight on it finish first)."""
        name = lora_name(version)
        answer = await self.http.request(
            "POST", "/load_lora_adapter", lora_load_request(path, version)
        )
        if isinstance(answer, dict) and not answer.get("success", False):
            raise EngineError(f"load_lora_adapter refused: {answer.get('error_message')}")
        old, self._lora, self._version = self._lora, name, version
        if old is not None and old != name:
            await self._update("/unload_lora_adapter", {"lora_name": old}, version)

    async def load_weights(self, path: str, version: int) -> None:
        answer = await self.http.request(
            "POST", "/update_weights_from_disk", disk_update_request(path, version)
        )
        if isinstance(answer, dict) and not answer.get("success", False):
            raise EngineError(f"weight update refused: {answer.get('message')}")
        self._version = version

    async def load_state(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Tensors to the server through ``/update_weights_from_tensor`` (CUDA IPC handles; see
        docs/engine.md#the-sglang-client). :class:`StateNotAccepted` when there is no GPU to share from."""
        import torch

        if not torch.cuda.is_available():
            raise StateNotAccepted("update_weights_from_tensor shares CUDA tensors; none here")
        device = torch.device("cuda", torch.cuda.current_device())
        # host tensors go to the GPU first; the copies live until the server answers (it
        # copies them into its model before replying)
        on_gpu = {k: t if t.is_cuda else t.to(device) for k, t in state.items()}
        torch.cuda.current_stream(device).synchronize()
        try:
            body = await asyncio.to_thread(tensor_update_request, on_gpu, version)
        except RuntimeError as e:  # e.g. memory this process mapped from another one
            raise StateNotAccepted(f"these tensors cannot be shared again: {e}") from e
        try:
            await self._update("/update_weights_from_tensor", body, version)
        except EngineError as e:
            if "HTTP 404" in str(e):  # a server without the route (older SGLang, `stacx serve`)
                raise StateNotAccepted(f"no /update_weights_from_tensor: {e}") from e
            raise

    async def update_weights_from_tensor(
        self, state: Mapping[str, torch.Tensor], version: int, *, tp_size: int = 1
    ) -> None:
        """``/update_weights_from_tensor`` with ``state`` as it is (see tensor_update_request)."""
        body = await asyncio.to_thread(tensor_update_request, state, version, tp_size=tp_size)
        await self._update("/update_weights_from_tensor", body, version)

    async def init_weights_update_group(
        self,
        *,
        master_address: str,
        master_port: int,
        world_size: int,
        group_name: str = UPDATE_GROUP,
        backend: str = "nccl",
        timeout_s: float = 600.0,
    ) -> ProcessGroup:
        """Ask the server to join a weight-update group (its ranks 1..world_size-1) and join
        it here as rank 0, concurrently; returns this side's group."""
        body = init_group_request(
            master_address=master_address,
            master_port=master_port,
            rank_offset=1,
            world_size=world_size,
            group_name=group_name,
            backend=backend,
        )
        joined = asyncio.create_task(
            asyncio.to_thread(
                join_update_group,
                master_address=master_address,
                master_port=master_port,
                world_size=world_size,
                group_name=group_name,
                backend=backend,
                timeout_s=timeout_s,
            )
        )
        try:
            answer = await self.http.request("POST", "/init_weights_update_group", body)
        except BaseException:
            joined.cancel()
            raise
        if isinstance(answer, dict) and not answer.get("success", False):
            raise EngineError(f"init_weights_update_group refused: {answer.get('message')}")
        return await joined

    async def update_weights_from_distributed(
        self,
        state: Mapping[str, torch.Tensor],
        version: int,
        group: ProcessGroup,
        *,
        group_name: str = UPDATE_GROUP,
    ) -> None:
        """``/update_weights_from_distributed`` while this process broadcasts ``state``."""
        body = distributed_update_request(state, version, group_name=group_name)
        request = asyncio.create_task(
            self._update("/update_weights_from_distributed", body, version)
        )
        await asyncio.to_thread(broadcast_state, state, group)
        await request

    async def _update(self, route: str, body: dict[str, object], version: int) -> None:
        answer = await self.http.request("POST", route, body)
        if isinstance(answer, dict) and not answer.get("success", False):
            raise EngineError(f"{route.lstrip('/')} refused: {answer.get('message')}")
        self._version = version

    async def flush_cache(self) -> None:
        await self.http.request("POST", "/flush_cache", idempotent=True)

    async def health(self) -> bool:
        try:
            await self.http.request("GET", "/health")
        except EngineError:
            return False
        return True

    async def close(self) -> None:
        await self.http.close()

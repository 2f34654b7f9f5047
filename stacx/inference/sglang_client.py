"""An :class:`Engine` backed by an SGLang server's native API (or by `stacx serve`): token in,
token out, SGLang's three weight-update paths and its LoRA routes.

``output_ids`` are the server's; a partial checkpoint is refused, never half-loaded; a state it
cannot hand over (no CUDA) raises :class:`StateNotAccepted`, so the caller loads the file.
Design: docs/engine.md#the-sglang-client
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import io
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import safe_open

from stacx.errors import EngineError
from stacx.inference.http import HttpClient
from stacx.ports import Generation, SamplingParams

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup


def sglang_sampling_params(params: SamplingParams, *, grammars: bool = False) -> dict[str, object]:
    """SGLang's ``sampling_params``; a grammar goes as ``ebnf`` only where ``grammars`` (a server
    reading llguidance's Lark form), otherwise it is refused, never dropped."""
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
    """``/update_weights_from_disk``'s body for ``path`` (its directory if a loadable HF one)."""
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
    return {"model_path": model_path, **_update_fields(version)}


def _update_fields(version: int) -> dict[str, object]:
    return {"weight_version": str(version), "abort_all_requests": False, "flush_cache": True}


class StateNotAccepted(EngineError):
    """These tensors cannot be sent to the server (no GPU to share them from): use the file."""


UPDATE_GROUP = "weight_update_group"  # SGLang's default group_name


def tensor_update_request(
    state: Mapping[str, torch.Tensor], version: int, *, tp_size: int = 1
) -> dict[str, object]:
    """The body of ``/update_weights_from_tensor``: ``list[(name, tensor)]`` as SGLang's
    ``MultiprocessingSerializer.serialize(obj, output_str=True)`` writes it (CUDA tensors as IPC
    handles, base64), one entry per TP rank."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers torch's reductions on ForkingPickler)

    buf = io.BytesIO()
    ForkingPickler(buf).dump(list(state.items()))
    entry = base64.b64encode(buf.getvalue()).decode("utf-8")
    return {
        "serialized_named_tensors": [entry] * tp_size,
        "load_format": None,
        **_update_fields(version),
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
        **_update_fields(version),
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
    """Join a weight-update group as SGLang's ``init_custom_process_group`` does (TCP rendezvous,
    a prefix store named ``group_name``); blocks until all ``world_size`` ranks joined."""
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
        """``retries``: attempts after a refused connection (nothing sent), backoff 0.5 s to 4 s.
        ``grammars``: the server reads llguidance's Lark grammars (`sglang_sampling_params`)."""
        self.http = HttpClient(base_url, timeout_s=timeout_s, retries=retries)
        self.grammars = grammars
        self.weight_version = weight_version
        self._lora: str | None = None  # the adapter generations use (load_adapter)

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
        version = self.weight_version
        # with an adapter, the server's weight_version is its base's: ours says more
        with contextlib.suppress(TypeError, ValueError):
            version = version if self._lora else int(meta.get("weight_version"))
        return Generation(
            output_ids=[int(t) for t in ids],
            logprobs=logprobs,
            finish_reason=str(kind) if kind in ("stop", "length") else "abort",
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
        """`LoadsAdapter`: ``/load_lora_adapter`` of the directory (read by the SERVER; ``state``
        is not sent), named in every later ``lora_path``; then the previous one is unloaded."""
        name = f"stacx-v{version}"  # SGLang's lora_name
        await self._post(
            "/load_lora_adapter", {"lora_name": name, "lora_path": path, "pinned": False}
        )
        old, self._lora, self.weight_version = self._lora, name, version
        if old is not None and old != name:
            await self._update("/unload_lora_adapter", {"lora_name": old}, version)

    async def load_weights(self, path: str, version: int) -> None:
        await self._update("/update_weights_from_disk", disk_update_request(path, version), version)

    async def load_state(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Tensors to the server as CUDA IPC handles (``/update_weights_from_tensor``);
        :class:`StateNotAccepted` when there is no GPU to share from."""
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
        """Join a weight-update group here as rank 0 while the server joins as ranks 1 and up."""
        group: dict[str, Any] = {
            "master_address": master_address,
            "master_port": master_port,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        joined = asyncio.create_task(
            asyncio.to_thread(join_update_group, **group, timeout_s=timeout_s)
        )
        try:  # the server's ranks join after this one: rank_offset 1
            await self._post("/init_weights_update_group", {**group, "rank_offset": 1})
        except BaseException:
            joined.cancel()
            raise
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
        import torch.distributed as dist

        def broadcast() -> None:  # rank 0's side: each tensor, in order
            for tensor in state.values():
                dist.broadcast(tensor.contiguous(), src=0, group=group)

        await asyncio.to_thread(broadcast)
        await request

    async def _post(self, route: str, body: dict[str, object]) -> None:
        answer = await self.http.request("POST", route, body)
        if isinstance(answer, dict) and not answer.get("success", False):
            reason = answer.get("message") or answer.get("error_message")
            raise EngineError(f"{route.lstrip('/')} refused: {reason}")

    async def _update(self, route: str, body: dict[str, object], version: int) -> None:
        await self._post(route, body)
        self.weight_version = version

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

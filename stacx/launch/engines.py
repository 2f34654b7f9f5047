"""Engines for roles: a recipe's engine settings -> a running Engine and its tokenizer. Every engine
(and any SGLang server started for it) is closed with the caller's AsyncExitStack: no orphan
servers.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path

from stacx.errors import EngineError
from stacx.ports import ChatTokenizer, Engine
from stacx.train.config import LoraConfig


async def open_engine(
    stack: AsyncExitStack,
    *,
    backend: str,
    model: str,
    device: str,
    dtype: str,
    url: str = "",
    max_batch: int = 8,
    max_len: int = 8192,
    tp: int = 1,
    mem_fraction: float = 0.85,
    log_dir: Path | None = None,
    lora: LoraConfig | None = None,
    kv_cache: str = "slots",
    cache_bytes: int | None = None,
) -> tuple[Engine, ChatTokenizer]:
    """Start (or connect to) an engine, closed with `stack`. ``lora``: ``[trainer.lora]`` (SGLang
    then serves adapters); ``kv_cache``, ``cache_bytes``: the torch engine's KV cache and budget."""
    if backend == "torch":
        return await _open_torch(
            stack, model, device, dtype, max_batch, max_len, kv_cache, cache_bytes
        )
    path, tokenizer = await open_tokenizer(model)
    if backend == "sglang":
        from stacx.inference.sglang_client import SGLangEngine
        from stacx.inference.sglang_server import start_sglang_server

        if not url:
            server = await asyncio.to_thread(
                start_sglang_server,
                path,
                extra_args=sglang_args(
                    device=device,
                    dtype=dtype,
                    max_batch=max_batch,
                    max_len=max_len,
                    tp=tp,
                    mem_fraction=mem_fraction,
                    lora=lora,
                ),
                log_dir=log_dir,
            )
            stack.callback(server.stop)
            url = server.url
        sglang = SGLangEngine(url)
        stack.push_async_callback(sglang.close)
        return sglang, tokenizer
    if backend == "openai":
        from stacx.inference.openai_client import OpenAIEngine

        if not url:
            raise EngineError("engine backend 'openai' needs a url (an OpenAI-compatible server)")
        oa = OpenAIEngine(url, model, tokenizer=tokenizer)
        stack.push_async_callback(oa.close)
        return oa, tokenizer
    raise EngineError(f"engine backend {backend!r}: accepted: torch, sglang, openai")


async def _open_torch(
    stack: AsyncExitStack,
    model: str,
    device: str,
    dtype: str,
    max_batch: int,
    max_len: int,
    kv_cache: str,
    cache_bytes: int | None,
) -> tuple[Engine, ChatTokenizer]:
    """STACX's own engine in this process (torch is imported only here)."""
    import torch

    from stacx.inference.torch_engine import TorchEngine

    torch_dtype = None if dtype == "auto" else getattr(torch, dtype)
    engine = await asyncio.to_thread(
        TorchEngine,
        model,
        device=device,
        dtype=torch_dtype,
        max_batch=max_batch,
        max_len=max_len,
        kv_cache=kv_cache,
        cache_bytes=cache_bytes,
    )
    stack.push_async_callback(engine.close)
    if engine.graphed:  # else the first requests would wait on kernel builds and graph captures
        await engine.warm_up()
    assert engine.tokenizer is not None
    return engine, engine.tokenizer  # type: ignore[return-value]


async def open_tokenizer(model: str) -> tuple[str, ChatTokenizer]:
    """The model's resolved path and its tokenizer alone (for a scripted agent, or a server-backed
    engine's chat format)."""
    from transformers import AutoTokenizer

    from stacx.hf import resolve_model

    path = await asyncio.to_thread(resolve_model, model)
    tokenizer: ChatTokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, path)  # type: ignore[arg-type]
    return path, tokenizer


def sglang_args(
    *,
    device: str,
    dtype: str,
    max_batch: int,
    max_len: int,
    tp: int,
    mem_fraction: float,
    lora: LoraConfig | None = None,
) -> tuple[str, ...]:
    """The recipe's engine settings as SGLang server flags ("auto" leaves SGLang's own choice)."""
    args = [
        "--tp", str(tp),
        "--mem-fraction-static", str(mem_fraction),
        "--max-running-requests", str(max_batch),
        "--context-length", str(max_len),
    ]  # fmt: skip
    if device != "auto":
        args += ["--device", device]
    if dtype != "auto":
        args += ["--dtype", dtype]
    if lora is not None:  # SGLang's LoRA serving (load_lora_adapter at every version)
        args += ["--enable-lora", "--max-lora-rank", str(lora.rank)]
        args += ["--lora-target-modules", *lora.target_modules]
    return tuple(args)

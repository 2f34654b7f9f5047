"""Where and how the torch engine runs: its CPU threads, its device and dtype, its model, and
its decode path (the hand-written Triton step, torch.compile, or eager; CUDA graphs or not).
The knobs (``threads``, ``kernels``, ``compile``, ``gemv_rows``, ``fuse``) and their measurements:
docs/engine.md#where-the-engine-runs
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
from torch import nn

from stacx.errors import EngineError
from stacx.hf import load_hf_model
from stacx.inference.decoder import Decoder
from stacx.inference.decoder_kernels import enable_kernels, kernels_unsupported

if TYPE_CHECKING:
    from stacx.inference.cuda_graphs import GraphedDecode
    from stacx.inference.kv_cache import KVCache


def set_threads(threads: int | None) -> None:
    """torch's intra-op CPU threads (None: $STACX_TORCH_THREADS, else 1 on <= 2 cores)."""
    threads = threads or int(os.environ.get("STACX_TORCH_THREADS", "0")) or None
    if threads is None and (os.cpu_count() or 1) <= 2:
        threads = 1  # a 2-core box is always shared: see the module docstring
    if threads is not None:
        torch.set_num_threads(threads)


def place_model(
    model: str | nn.Module | None, device: str, dtype: torch.dtype | None
) -> tuple[nn.Module, object | None, str, torch.device]:
    """`model` ("default"/None, an HF directory, a hub id, or a ready nn.Module) on `device`
    ("auto": CUDA where there is one) in `dtype` (None: bf16 on CUDA, fp32 on CPU): the model,
    its tokenizer (None for a module given), its path ("" for a module) and the device."""
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(auto if device == "auto" else device)
    dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    if isinstance(model, nn.Module):
        return model.to(device=dev, dtype=dtype).eval(), None, "", dev
    loaded, tokenizer, path = load_hf_model(model, dev, dtype)
    return loaded, tokenizer, path, dev


def decode_path(
    decoder: Decoder,
    cache: KVCache,
    dev: torch.device,
    *,
    cuda_graphs: bool,
    kernels: bool | None,
    compile: bool | None,
    compile_mode: str | None,
    gemv_rows: int,
) -> GraphedDecode | None:
    """Switch `decoder` to its decode path; the CUDA graphs over `cache`, or None (eager steps)."""
    if kernels and not (dev.type == "cuda" and cuda_graphs):
        raise EngineError(
            "kernels=True needs a CUDA device with cuda_graphs=True (the Triton decode step "
            f"is captured in CUDA graphs); this engine runs on {dev.type}"
            + ("" if cuda_graphs else " without CUDA graphs")
        )
    if dev.type != "cuda" or not cuda_graphs:
        return None
    from stacx.inference.cuda_graphs import GraphedDecode

    if kernels or (kernels is None and kernels_unsupported(decoder) is None):
        enable_kernels(decoder, gemv_rows)
    elif compile is None or compile:
        decoder.enable_compile(compile_mode, gemv_rows)
    return GraphedDecode(decoder, cache)

"""Where and how the torch engine runs: its CPU threads, its device and dtype, its model, and
its decode path (the hand-written Triton step, torch.compile, or eager; CUDA graphs or not).

Knobs (arguments of :class:`~stacx.inference.torch_engine.TorchEngine`):

- ``threads`` sets torch's intra-op CPU threads for the whole process (None:
  $STACX_TORCH_THREADS, else 1 on machines with <= 2 cores, else torch's default). On a small,
  busy machine fewer threads can be much faster: OpenMP barriers stall when a core is taken by
  another process (measured here: 2 threads 14x slower than 1 under load).
- ``kernels`` (CUDA graphs only; default: on where the model allows it, see
  ``Decoder.kernels_unsupported``): decode steps and prefills run as the hand-written Triton
  step (triton_kernels.py, triton_pick.py); True where the model does not allow it is an
  error. H200, Qwen3-0.6B shape, prompt 256 + 256 new tokens, 2026-12-02: 1,057 tok/s at batch
  1 and 33,929 at batch 64 against 744 and 20,315 with the torch.compile'd step.
- ``compile`` (without the kernels; default: on with CUDA graphs) fuses the decode step with
  torch.compile; the first step of each new shape then compiles (tens of seconds).
  ``compile_mode``: torch.compile's mode for the decode step (None: its default).
- ``gemv_rows`` (CUDA): steps of at most this many rows run their projections as GEMV kernels
  instead of cuBLAS GEMMs (0: off): with the kernels, Triton GEMVs with the norm, residual add
  and SiLU gate folded in (batch 1: 0.91 ms per step against 1.37 with cuBLAS); compiled,
  inductor reduction kernels. Greedy outputs equal HF ``generate`` on CUDA in fp32 (tested).
- ``fuse``: one GEMM for each layer's q/k/v and one for gate/up (see decoder.py); False only to
  measure the difference (the kernels need it).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
from torch import nn

from stacx.errors import EngineError
from stacx.hf import load_hf_model
from stacx.inference.decoder import Decoder

if TYPE_CHECKING:
    from stacx.inference.cuda_graphs import GraphedDecode
    from stacx.inference.kv_cache import KVCache


def set_threads(threads: int | None) -> None:
    """torch's intra-op CPU threads (see the module docstring's ``threads``)."""
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
    """Switch `decoder` to its decode path (see the module docstring); the CUDA graphs of its
    steps over `cache`, or None (CPU, or CUDA without graphs: eager steps)."""
    if kernels and not (dev.type == "cuda" and cuda_graphs):
        raise EngineError(
            "kernels=True needs a CUDA device with cuda_graphs=True (the Triton decode step "
            f"is captured in CUDA graphs); this engine runs on {dev.type}"
            + ("" if cuda_graphs else " without CUDA graphs")
        )
    if dev.type != "cuda" or not cuda_graphs:
        return None
    from stacx.inference.cuda_graphs import GraphedDecode

    if kernels or (kernels is None and decoder.kernels_unsupported() is None):
        decoder.enable_kernels(gemv_rows)
    elif compile is None or compile:
        decoder.enable_compile(compile_mode, gemv_rows)
    return GraphedDecode(decoder, cache)

"""Build every Triton kernel the Triton step launches, for an H100 (sm_90), on a machine with no
GPU: Triton's real compiler (TTIR -> TTGIR -> LLVM -> PTX -> ptxas cubin) behind a driver that
only compiles. It checks each kernel's shared memory against an H100's 227 KiB, and its launch
does nothing (the tensors live on the CPU).

Run as a script (``python tests/inference/sm90_build.py``), never with TRITON_INTERPRET set:
the kernels must be built as the GPU builds them. Prints one JSON line: each kernel built (one
per specialization), its registers, spill bytes and shared memory. With ``--decode-grid``: the
decode step at every (batch bucket, key-length bucket) a cold engine meets up to 6,144 keys
(Qwen3-0.6B's layer over a paged cache); the line gives each kernel's builds and their seconds
(what a cold engine pays in Triton JIT for its decode steps)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import transformers
import triton
from triton.backends.compiler import GPUTarget

from stacx.inference import triton_kernels, triton_pick
from stacx.inference.decoder import Decoder
from stacx.inference.decoder_kernels import enable_kernels, triton_builds, triton_functions

H100_SHARED = 232448  # bytes of shared memory one block may opt in to on an H100


class _Utils:
    def get_device_properties(self, device: int) -> dict[str, int]:
        return {"max_shared_mem": H100_SHARED, "multiprocessor_count": 132, "warpSize": 32}

    def load_binary(self, name: str, kernel: bytes, shared: int, device: int) -> tuple:
        return None, None, 0, 0, 1024  # module, function, registers, spills, max threads


class BuildOnly:
    """Triton's driver interface, for an H100 that is not there: kernels build, launches skip."""

    utils = _Utils()

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")

    def launcher_cls(self, src: Any, metadata: Any) -> Any:
        return lambda *args: None


def _model(family: str) -> torch.nn.Module:
    """Two layers of SmolLM2-135M (Llama: 9 query heads over 3 kv heads of 64) or of a Qwen3
    (q/k norms, 16 query heads over 8 kv heads of 128), in bfloat16, random weights."""
    torch.manual_seed(0)
    if family == "llama":
        cfg: Any = transformers.LlamaConfig(
            hidden_size=576,
            intermediate_size=1536,
            num_attention_heads=9,
            num_key_value_heads=3,
            num_hidden_layers=2,
            vocab_size=49152,
            max_position_embeddings=2048,
        )
        return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    cfg = transformers.Qwen3Config(
        hidden_size=1024,
        intermediate_size=3072,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        num_hidden_layers=2,
        vocab_size=4096,
        max_position_embeddings=2048,
    )
    return transformers.Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()


def _kernel_decoder(family: str, capacity: int) -> Decoder:
    """A decoder of `_model(family)` with the Triton step kernels on, as the engine enables them
    (TRITON_INTERPRET is set only across enable_kernels' device check: a CPU here)."""
    dec = Decoder(_model(family), capacity)
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        enable_kernels(dec, gemv_rows=4, gemm_rows=64)
    finally:
        del os.environ["TRITON_INTERPRET"]
    return dec


def _engine_steps(family: str) -> None:
    """The step's launches as the engine makes them: a flat prefill (fresh prompts, then a turn
    on a reused prefix), decode steps at a GEMV, a Triton-GEMM and a cuBLAS row count, over a
    slot cache and a paged one; then the token pick, greedy and sampled."""
    dec = _kernel_decoder(family, 512)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 4000, (n,), generator=gen).tolist() for n in (40, 300, 7)]
    slots = dec.new_cache()
    slots.grow(130, 513)
    paged = dec.new_paged_cache(rows=130, blocks=700, block=16)
    for row in range(130):
        paged.set_row(row, list(range(1 + 5 * row, 6 + 5 * row)))
    for cache in (slots, paged):
        rows = [0, 1, 2]
        dec.prefill(cache, rows, [0, 0, 0], prompts, [n - 1 for n in (40, 300, 7)])
        dec.prefill(cache, rows, [40, 300, 7], [p[:20] for p in prompts], [0, 0, 0])
        for batch, keys in ((1, 320), (16, 64), (130, 512)):  # keys split (and combined) or not
            ids = torch.randint(3, 4000, (batch,), generator=gen)
            dec.decode(cache, ids, torch.full((batch,), 24), keys)
    logits = torch.randn(16, dec.model.config.vocab_size).to(torch.bfloat16)
    out_tok, out_lp = torch.empty(16), torch.empty(16)
    triton_pick.pick(logits, out_tok, out_lp)
    draw = (torch.full((16,), 0.7), torch.arange(16), torch.arange(16))
    triton_pick.pick(logits, out_tok, out_lp, draw)


def _decode_grid() -> dict[str, Any]:
    """The decode step launched as the CUDA graphs capture it: every batch bucket up to 64 rows
    at every key-length bucket up to 6,144 keys (two Qwen3-0.6B layers over a paged cache of
    64-position blocks, bf16), then the greedy token pick over 1 to 64 rows of Qwen3's
    vocabulary (as after prefills); the builds of each kernel and their time."""
    from stacx.inference.cuda_graphs import BATCH_BUCKETS, kv_bucket

    dec = _kernel_decoder("qwen3", 6200)
    paged = dec.new_paged_cache(rows=64, blocks=8, block=64)  # launches skip: shapes suffice
    keys = sorted({kv_bucket(n, 6144) for n in range(1, 6145)})
    batches = [b for b in BATCH_BUCKETS if b <= 64]
    t0 = time.perf_counter()
    for b in batches:
        for n in keys:
            dec.decode(paged, torch.zeros(b, dtype=torch.long), torch.zeros(b, dtype=torch.long), n)
    for rows in range(1, 65):  # the first tokens after a prefill: any row count (Qwen3's vocab)
        logits = torch.zeros(rows, 151936, dtype=torch.bfloat16)
        triton_pick.pick(logits, torch.empty(rows), torch.empty(rows))
    return {
        "shapes": len(keys) * len(batches),
        "seconds": round(time.perf_counter() - t0, 1),
        "builds": {name: n for name, n in triton_builds().items() if n},
    }


def _usage(cubin: bytes) -> dict[str, int]:
    """A cubin's registers per thread and spill bytes per thread (LOCAL), as
    ``cuobjdump --dump-resource-usage`` (shipped with Triton) reads them."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run(
            [tool, "--dump-resource-usage", f.name], capture_output=True, text=True
        )
    fields = dict(re.findall(r"\b(REG|LOCAL):(\d+)", out.stdout))
    return {k.lower(): int(v) for k, v in fields.items()}


def main() -> None:
    assert os.environ.get("TRITON_INTERPRET") != "1", "run without TRITON_INTERPRET"
    triton.runtime.driver.set_active(BuildOnly())  # type: ignore[arg-type]
    # an H100's driver: programmatic dependent launch where CUDA 12.3+ captures it in graphs
    driver = triton_kernels.cuda_driver_version
    triton_kernels.cuda_driver_version = lambda: 12020  # type: ignore[assignment]
    pdl_on_12_2 = triton_kernels.pdl()["PDL"]
    triton_kernels.cuda_driver_version = lambda: triton_kernels.PDL_DRIVER  # type: ignore[assignment]
    if sys.argv[1:] == ["--decode-grid"]:
        print(json.dumps(_decode_grid()))
        return
    for family in sys.argv[1:] or ["llama", "qwen3"]:
        _engine_steps(family)
    built = []
    for name, fn in triton_functions():
        for kernel in fn.device_caches[0][0].values() if fn.device_caches else ():
            usage = _usage(kernel.asm["cubin"])
            built.append({"kernel": name, "shared": kernel.metadata.shared, **usage})
    pdl = {"pdl": triton_kernels.pdl()["PDL"], "pdl_on_12_2": pdl_on_12_2, "host_driver": driver()}
    print(json.dumps({"built": built, **pdl}))


if __name__ == "__main__":
    main()

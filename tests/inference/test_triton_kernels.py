"""The Triton decode step (triton_kernels.py, through ``Decoder.enable_kernels``) against the
torch-op step and transformers' greedy ``generate``, on small random models of each supported
family (Qwen3: q/k norms and GQA; Llama: MHA; Qwen2: q/k/v biases), in float32.

On a GPU the kernels run natively; elsewhere under Triton's interpreter (``TRITON_INTERPRET=1``,
set by tests/conftest.py before triton is first imported), so CI checks their indexing, masking,
key splits and cache writes on the CPU. The engine-level CUDA path (graphs, 16 steps per replay) is
test_cuda_path.py."""

from __future__ import annotations

import copy
import os

import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1", allow_module_level=True)

import transformers

from stacx.errors import EngineError
from stacx.inference import triton_kernels
from stacx.inference.decoder import Decoder
from stacx.inference.torch_engine import TorchEngine

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = dict(hidden_size=128, num_hidden_layers=2, intermediate_size=256, vocab_size=500,
             max_position_embeddings=512)  # fmt: skip


def model(family: str, **extra: object) -> torch.nn.Module:
    torch.manual_seed(0)
    if family == "qwen3":
        cfg = transformers.Qwen3Config(**SMALL, num_attention_heads=8, num_key_value_heads=2,
                                       head_dim=32, **extra)  # fmt: skip
        return transformers.Qwen3ForCausalLM(cfg).float().to(DEVICE).eval()
    if family == "llama":
        cfg = transformers.LlamaConfig(**SMALL, num_attention_heads=4, num_key_value_heads=4, **extra)
        return transformers.LlamaForCausalLM(cfg).float().to(DEVICE).eval()
    cfg = transformers.Qwen2Config(**SMALL, num_attention_heads=4, num_key_value_heads=2, **extra)
    return transformers.Qwen2ForCausalLM(cfg).float().to(DEVICE).eval()


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen2"])
@pytest.mark.parametrize(("rows", "gemv_rows"), [(1, 0), (1, 4), (3, 4), (6, 0)])
def test_kernel_step_equals_the_torch_step(family: str, rows: int, gemv_rows: int) -> None:
    """Same logits and the same keys/values written, for rows at tile and split boundaries
    (few rows: the keys are split across programs), plus a padded row at the scratch cell;
    with GEMMs, and with GEMV kernels (norms, residuals and the SiLU gate folded in)."""
    dec = Decoder(model(family), 300)
    cache = dec.new_cache()
    cache.grow(rows, 301)
    lengths = [191, 63, 64, 127, 1, 130][:rows]
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 500, (n,), generator=gen).tolist() for n in lengths]
    dec.prefill(cache, list(range(rows)), [0] * rows, prompts, [n - 1 for n in lengths])
    pos = torch.tensor(lengths, device=DEVICE)
    if rows > 1:
        pos[-1] = cache.capacity - 1  # a padded row
    ids = torch.randint(3, 500, (rows,), generator=gen).to(DEVICE)
    mine = copy.deepcopy(cache)
    ref = dec.decode(cache, ids, pos, 192)
    dec.enable_kernels(gemv_rows)
    out = dec.decode(mine, ids, pos, 192)
    real = slice(0, rows if rows == 1 else rows - 1)
    torch.testing.assert_close(out[real], ref[real], atol=1e-4, rtol=1e-4)
    for layer in range(len(cache.k)):
        for name in ("k", "v"):
            a, b = getattr(mine, name)[layer][real], getattr(cache, name)[layer][real]
            torch.testing.assert_close(a[:, :, :-1], b[:, :, :-1], atol=1e-5, rtol=1e-5)


async def test_kernel_greedy_decode_equals_hf_generate() -> None:
    net = model("qwen3")
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 500, (n,), generator=gen).tolist() for n in (5, 40, 21)]
    new = 6
    refs = []
    for p in prompts:
        ids = torch.tensor([p], device=DEVICE)
        out = net.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,  # type: ignore[operator]
                           min_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)  # fmt: skip
        refs.append(out[0, len(p) :].tolist())
    dec = Decoder(net, 128)
    dec.enable_kernels(gemv_rows=4)
    cache = dec.new_cache()
    cache.grow(len(prompts), 129)
    logits = dec.prefill(cache, [0, 1, 2], [0, 0, 0], prompts, [len(p) - 1 for p in prompts])
    tokens = [[int(lg[-1].argmax())] for lg in logits]
    for step in range(new - 1):
        ids = torch.tensor([t[-1] for t in tokens], device=DEVICE)
        pos = torch.tensor([len(p) + step for p in prompts], device=DEVICE)
        out = dec.decode(cache, ids, pos, 128)
        for row, tok in zip(tokens, out.argmax(-1).tolist(), strict=True):
            row.append(tok)
    assert tokens == refs


def test_unsupported_models_and_devices_are_errors_naming_the_cause() -> None:
    dec = Decoder(model("llama", hidden_act="gelu"), 64)
    reason = dec.kernels_unsupported()
    assert reason is not None and "GELU" in reason and "SiLU" in reason
    with pytest.raises(EngineError, match=r"cannot run this model.*GELU"):
        dec.enable_kernels()
    if DEVICE == "cpu":
        with pytest.raises(EngineError, match="kernels=True needs a CUDA device"):
            TorchEngine(model("qwen3"), device="cpu", kernels=True)


@pytest.mark.parametrize("case", ["fresh", "one row", "prefix reuse", "chunked"])
def test_kernel_prefill_equals_the_torch_prefill(case: str) -> None:
    """The fused norms, rope and cache writes of the kernel prefill give the torch prefill's
    logits and cache, for fresh prompts (causal, no mask), a single row (its per-token slot
    ids are a broadcast of one), a reused prefix (masked) and prompts split into chunks."""
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 500, (n,), generator=gen).tolist() for n in (9, 30)]
    prompts = prompts[1:] if case == "one row" else prompts
    rows = list(range(len(prompts)))
    offsets = [4, 20] if case == "prefix reuse" else [0] * len(prompts)
    budget = 24 if case == "chunked" else None
    results = []
    for kernels in (False, True):
        dec = Decoder(model("qwen3"), 64)
        cache = dec.new_cache()
        cache.grow(2, 65)
        if kernels:
            dec.enable_kernels()
        if any(offsets):  # the reused prefix's keys, written by the torch path either way
            dec.kernels = False
            dec.prefill(cache, rows, [0] * len(rows), [p[:o] for p, o in zip(prompts, offsets, strict=True)],
                        [o - 1 for o in offsets])  # fmt: skip
            dec.kernels = kernels
        logits = dec.prefill(cache, rows, offsets, [p[o:] for p, o in zip(prompts, offsets, strict=True)],
                             [0] * len(rows), token_budget=budget)  # fmt: skip
        results.append((logits, cache))
    (ref, ref_cache), (mine, cache) = results
    for a, b in zip(mine, ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    for row, length in enumerate(len(p) for p in prompts):
        for layer in range(len(cache.k)):
            torch.testing.assert_close(cache.k[layer][row, :, :length], ref_cache.k[layer][row, :, :length])
            torch.testing.assert_close(cache.v[layer][row, :, :length], ref_cache.v[layer][row, :, :length])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "vocab"), [(1, 151936), (3, 5000)])
def test_greedy_pick_is_torch_argmax_and_log_softmax(dtype: torch.dtype, rows: int, vocab: int) -> None:
    """The multi-step replay's token pick: the first index of a tied max, as torch.argmax, and
    its log_softmax, over a vocabulary split across programs."""
    gen = torch.Generator().manual_seed(4)
    logits = (torch.randn(rows, vocab, generator=gen) * 3).to(dtype).to(DEVICE)
    logits[0, [vocab - 1, 7, vocab // 2]] = logits[0].max() + 1  # a three-way tie
    out_tok, out_lp = torch.empty(rows, device=DEVICE), torch.empty(rows, device=DEVICE)
    tok = triton_kernels.greedy_pick(logits, out_tok, out_lp)
    ref = logits.float().argmax(-1)
    assert tok.tolist() == ref.tolist() and tok[0] == 7
    assert out_tok.tolist() == ref.float().tolist()
    lp = torch.log_softmax(logits.float(), -1).gather(1, ref[:, None]).squeeze(1)
    torch.testing.assert_close(out_lp, lp, atol=5e-5, rtol=0)

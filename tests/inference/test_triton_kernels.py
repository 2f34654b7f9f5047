"""The Triton decode step (triton_kernels.py, through decoder_kernels.py) against the
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
from stacx.inference import triton_attention, triton_kernels, triton_pick
from stacx.inference.decoder import Decoder
from stacx.inference.decoder_kernels import enable_kernels, kernels_unsupported
from stacx.inference.torch_engine import TorchEngine

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = dict(
    hidden_size=128,
    num_hidden_layers=2,
    intermediate_size=256,
    vocab_size=500,
    max_position_embeddings=512,
)


def model(family: str, **extra: object) -> torch.nn.Module:
    torch.manual_seed(0)
    if family == "qwen3":
        cfg = transformers.Qwen3Config(
            **SMALL, num_attention_heads=8, num_key_value_heads=2, head_dim=32, **extra
        )
        return transformers.Qwen3ForCausalLM(cfg).float().to(DEVICE).eval()
    if family == "llama":
        cfg = transformers.LlamaConfig(
            **SMALL, num_attention_heads=4, num_key_value_heads=4, **extra
        )
        return transformers.LlamaForCausalLM(cfg).float().to(DEVICE).eval()
    cfg = transformers.Qwen2Config(**SMALL, num_attention_heads=4, num_key_value_heads=2, **extra)
    return transformers.Qwen2ForCausalLM(cfg).float().to(DEVICE).eval()


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen2"])
@pytest.mark.parametrize(
    ("rows", "gemv_rows", "gemm_rows"), [(1, 0, 0), (1, 4, 0), (3, 4, 0), (6, 0, 0), (6, 0, 64)]
)
def test_kernel_step_equals_the_torch_step(
    family: str, rows: int, gemv_rows: int, gemm_rows: int
) -> None:
    """Same logits and the same keys/values written, for rows at tile and split boundaries
    (few rows: the keys are split across programs), plus a padded row at the scratch cell;
    with cuBLAS GEMMs, with GEMV kernels (norms, residuals and the SiLU gate folded in) and
    with Triton GEMMs (the SiLU gate folded in, the narrow ones split-K and summed in the next
    add+RMSNorm)."""
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
    enable_kernels(dec, gemv_rows, gemm_rows)
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
        out = net.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,  # type: ignore[operator]
            min_new_tokens=new,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        refs.append(out[0, len(p) :].tolist())
    dec = Decoder(net, 128)
    enable_kernels(dec, gemv_rows=4)
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
    reason = kernels_unsupported(dec)
    assert reason is not None and "GELU" in reason and "SiLU" in reason
    with pytest.raises(EngineError, match=r"cannot run this model.*GELU"):
        enable_kernels(dec)
    if DEVICE == "cpu":
        with pytest.raises(EngineError, match="kernels=True needs a CUDA device"):
            TorchEngine(model("qwen3"), device="cpu", kernels=True)


@pytest.mark.parametrize(
    "case", ["fresh", "one row", "prefix reuse", "chunked", "slots out of order"]
)
def test_kernel_prefill_equals_the_torch_prefill(case: str) -> None:
    """The fused norms, rope and cache writes of the kernel prefill give the torch prefill's
    logits and cache, for fresh prompts (causal, no mask), a single row (its per-token slot
    ids are a broadcast of one), a reused prefix (masked), prompts split into chunks, and
    slots that are not consecutive (attention gathers the rows' keys instead of a slice)."""
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 500, (n,), generator=gen).tolist() for n in (9, 30)]
    prompts = prompts[1:] if case == "one row" else prompts
    rows = [1, 0] if case == "slots out of order" else list(range(len(prompts)))
    offsets = [4, 20] if case == "prefix reuse" else [0] * len(prompts)
    budget = 24 if case == "chunked" else None
    results = []
    for kernels in (False, True):
        dec = Decoder(model("qwen3"), 64)
        cache = dec.new_cache()
        cache.grow(2, 65)
        if kernels:
            enable_kernels(dec)
        if any(offsets):  # the reused prefix's keys, written by the torch path either way
            step, dec.kernel_step = dec.kernel_step, None
            dec.prefill(
                cache,
                rows,
                [0] * len(rows),
                [p[:o] for p, o in zip(prompts, offsets, strict=True)],
                [o - 1 for o in offsets],
            )
            dec.kernel_step = step
        logits = dec.prefill(
            cache,
            rows,
            offsets,
            [p[o:] for p, o in zip(prompts, offsets, strict=True)],
            [0] * len(rows),
            token_budget=budget,
        )
        results.append((logits, cache))
    (ref, ref_cache), (mine, cache) = results
    for a, b in zip(mine, ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    for row, length in zip(rows, (len(p) for p in prompts), strict=True):
        for layer in range(len(cache.k)):
            torch.testing.assert_close(
                cache.k[layer][row, :, :length], ref_cache.k[layer][row, :, :length]
            )
            torch.testing.assert_close(
                cache.v[layer][row, :, :length], ref_cache.v[layer][row, :, :length]
            )


def test_rope_cache_is_the_same_for_any_heads_per_program() -> None:
    """The rope + cache-write kernel handles several heads per program (all of a token's in a
    long prefill): the same q and cache cells for 1, 4 (the prefill test's), 8 (a partly masked
    second program of 12 heads) and 16 (one program, masked rows) heads per program."""
    dec = Decoder(model("qwen3"), 64)
    enable_kernels(dec)
    w = dec.kernel_step.layers[0]
    gen = torch.Generator().manual_seed(5)
    tokens, width = 7, (dec.n_heads + 2 * dec.n_kv) * dec.head_dim
    qkv = torch.randn(tokens, width, generator=gen).to(DEVICE)
    pos = torch.tensor([0, 3, 9, 10, 30, 63, 5], device=DEVICE)
    slot = torch.tensor([1, 0, 2, 1, 0, 2, 0], device=DEVICE)
    out = []
    for heads in (4, 1, 8, 16):
        cache = dec.new_cache()
        cache.grow(3, 65)
        q = triton_kernels.rope_cache(
            qkv,
            pos,
            slot,
            cache.k[0],
            cache.v[0],
            dec.cos,
            dec.sin,
            dec.n_heads,
            dec.n_kv,
            w.qk_norm,
            heads=heads,
        )
        out.append((q, cache.k[0].clone(), cache.v[0].clone()))
    for got in out[1:]:
        for a, b in zip(got, out[0], strict=True):  # the norm's sum may run in another order
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    assert out[0][1][0, :, 3].abs().sum() > 0 and out[0][2][2, :, 63].abs().sum() > 0  # written


def test_triton_gemm_split_k_and_glu_equal_f_linear() -> None:
    """The Triton GEMM at edges the model tests do not reach: a narrow output whose keys are
    split across 4 programs (the partial sums and the bias added in add+RMSNorm), output
    columns and keys that are not multiples of the tiles (masks), the SiLU gate folded in."""
    gen = torch.Generator().manual_seed(6)
    rand = lambda *shape: torch.randn(*shape, generator=gen).to(DEVICE)  # noqa: E731
    x, w, b, res, nw = rand(6, 1024), rand(96, 1024) * 0.05, rand(96), rand(6, 96), rand(96)
    parts = triton_kernels.gemm_partials(x, w, b)
    assert isinstance(parts, triton_kernels.Partials) and parts.parts.shape == (4, 6, 96)
    xo, h = triton_kernels.add_rmsnorm(res, parts, nw, 1e-6)
    ref = res + torch.nn.functional.linear(x, w, b)
    torch.testing.assert_close(xo, ref, atol=1e-4, rtol=1e-4)
    ref_h = nw * (ref * torch.rsqrt(ref.pow(2).mean(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(h, ref_h, atol=1e-4, rtol=1e-4)
    x, w, b = rand(5, 100), rand(2 * 40, 100) * 0.1, rand(80)
    gate, up = torch.nn.functional.linear(x, w, b).chunk(2, dim=-1)
    torch.testing.assert_close(
        triton_kernels.gemm(x, w, b, glu=True),
        torch.nn.functional.silu(gate) * up,
        atol=1e-5,
        rtol=1e-5,
    )
    torch.testing.assert_close(triton_kernels.gemm(x, w), x @ w.T, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="65 rows, at most 64"):
        triton_kernels.gemm(rand(65, 100), w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "vocab"), [(1, 151936), (3, 5000)])
def test_greedy_pick_is_torch_argmax_and_log_softmax(
    dtype: torch.dtype, rows: int, vocab: int
) -> None:
    """The multi-step replay's token pick: the first index of a tied max, as torch.argmax, and
    its log_softmax, over a vocabulary split across programs."""
    gen = torch.Generator().manual_seed(4)
    logits = (torch.randn(rows, vocab, generator=gen) * 3).to(dtype).to(DEVICE)
    logits[0, [vocab - 1, 7, vocab // 2]] = logits[0].max() + 1  # a three-way tie
    out_tok, out_lp = torch.empty(rows, device=DEVICE), torch.empty(rows, device=DEVICE)
    tok = triton_pick.pick(logits, out_tok, out_lp)
    ref = logits.float().argmax(-1)
    assert tok.tolist() == ref.tolist() and tok[0] == 7
    assert out_tok.tolist() == ref.float().tolist()
    lp = torch.log_softmax(logits.float(), -1).gather(1, ref[:, None]).squeeze(1)
    torch.testing.assert_close(out_lp, lp, atol=5e-5, rtol=0)


def test_sampled_pick_draws_from_softmax_over_temperature() -> None:
    """The sampling pick (the multi-step replay's draw at temperature > 0): token frequencies
    follow softmax(logits / T) over 800 seeds, the logprob is log_softmax of the raw logits,
    a temperature-0 row is the argmax, and a row's draw depends only on its (seed, position):
    the same in another batch, at another row index, and with a vocabulary split across
    programs."""
    vocab, n, temp = 6, 800, 0.5
    logits = torch.tensor([1.0, 0.2, -0.5, 1.4, 0.0, -2.0])
    batch = logits.repeat(n, 1).to(DEVICE)
    temps = torch.full((n,), temp, device=DEVICE)
    temps[0] = 0.0
    seeds = torch.arange(n, dtype=torch.int64, device=DEVICE) * 7919 + 12345
    pos = torch.full((n,), 9, device=DEVICE)
    out_tok, out_lp = torch.empty(n, device=DEVICE), torch.empty(n, device=DEVICE)
    tok = triton_pick.pick(batch, out_tok, out_lp, (temps, seeds, pos)).cpu()
    assert tok[0] == 3  # temperature 0: the argmax
    freq = torch.bincount(tok[1:], minlength=vocab).float() / (n - 1)
    want = torch.softmax(logits / temp, -1)
    assert (freq - want).abs().max() < 4 * (want * (1 - want) / (n - 1)).sqrt().max(), (freq, want)
    torch.testing.assert_close(out_lp.cpu(), torch.log_softmax(logits, -1)[tok], atol=1e-5, rtol=0)
    # rows 5 and 17 alone, swapped, at the same positions: the same draws; another position: not
    sub = [17, 5]
    again = triton_pick.pick(
        batch[sub], out_tok[:2], out_lp[:2], (temps[sub], seeds[sub], pos[sub])
    )
    assert again.tolist() == tok[sub].tolist()
    head = slice(0, 200)
    moved = triton_pick.pick(
        batch[head], out_tok[head], out_lp[head], (temps[head], seeds[head], pos[head] + 1)
    )
    assert (moved[1:].cpu() != tok[1:200]).float().mean() > 0.2
    # a vocabulary of 20,000 split across programs: the draw of each row still repeats and lands
    # on the one token that dominates it
    wide = torch.full((3, 20000), -30.0, device=DEVICE)
    wide[0, 12345], wide[1, 3], wide[2, 19999] = 0.0, 0.0, 0.0
    three = (torch.ones(3, device=DEVICE), seeds[:3], pos[:3])
    first = triton_pick.pick(wide, out_tok[:3], out_lp[:3], three)
    assert first.tolist() == [12345, 3, 19999]


@pytest.mark.parametrize("splits", [1, 3, 16, 40])
def test_decode_attention_merges_any_number_of_key_splits(splits: int) -> None:
    """`decode_attention` with its keys split in 1 to 40 ranges (40: the combine merges the
    partials over three of its tiles, with running maxima): softmax attention over each row's
    keys ``[0, pos]``; a row at the scratch cell (no keys) gives zeros, and a row with fewer keys
    than ranges leaves some ranges empty."""
    gen = torch.Generator().manual_seed(7)
    heads, n_kv, dim, rows, keys = 4, 2, 16, 4, 320
    kc, vc = (torch.randn(rows, n_kv, keys + 1, dim, generator=gen) for _ in range(2))
    q = torch.randn(rows, heads, dim, generator=gen)
    pos = [319, 100, 3, keys]  # the last: the scratch cell, past `keys`
    to = {"device": DEVICE}
    out = triton_attention.decode_attention(
        q.to(**to), kc.to(**to), vc.to(**to), torch.tensor(pos, **to), keys, 0.25, splits=splits
    ).cpu()
    for r, p in enumerate(pos[:-1]):
        k, v = kc[r, :, : p + 1].repeat_interleave(2, 0), vc[r, :, : p + 1].repeat_interleave(2, 0)
        ref = (torch.softmax(q[r][:, None, :] @ k.transpose(1, 2) * 0.25, -1) @ v)[:, 0]
        torch.testing.assert_close(out[r], ref, atol=1e-5, rtol=1e-5)
    assert out[-1].abs().max() == 0


@pytest.mark.parametrize(
    "launch",
    [triton_attention.PREFILL, triton_attention.PrefillLaunch(128, 32, 8, 2)],
    ids=["engine", "128-pairs-32-keys"],
)
@pytest.mark.parametrize("paged", [False, True])
def test_prefill_attention_is_causal_attention_over_each_rows_cache(
    paged: bool, launch: triton_attention.PrefillLaunch
) -> None:
    """`prefill_attention`: rows of ragged new tokens (one starting mid-row after cached keys,
    one longer than a tile, a 3:1 GQA ratio that leaves part of each tile's pairs unused) and
    an unused tile; each token's output is softmax attention over its row's keys up to its own
    position, read from slots or from shuffled paged blocks; under the engine's launch and a
    larger one (twice the tokens a tile, half the keys a step)."""
    gen = torch.Generator().manual_seed(5)
    heads, n_kv, dim, slots, cap, block = 6, 2, 16, 3, 200, 8
    kc, vc = (torch.randn(slots, n_kv, cap, dim, generator=gen) for _ in range(2))
    tile = triton_attention.prefill_tile_tokens(heads // n_kv, launch)
    pos, owner, tiles = [], [], []
    for row, first, count in ((1, 50, 50), (2, 0, 10)):  # row 1: 50 cached keys, then 50 new
        tiles += [(row, len(pos) + s, min(tile, count - s)) for s in range(0, count, tile)]
        pos += range(first, first + count)
        owner += [row] * count
    tiles.append((0, 0, 0))
    q = torch.randn(len(pos), heads, dim, generator=gen)
    ref = torch.stack(
        [
            torch.stack(
                [
                    torch.softmax(q[t, h] @ kc[r, h // 3, : p + 1].T * 0.25, -1)
                    @ vc[r, h // 3, : p + 1]
                    for h in range(heads)
                ]
            )
            for t, (r, p) in enumerate(zip(owner, pos, strict=True))
        ]
    )
    table = None
    if paged:  # each row's blocks scattered over a pool, in a shuffled order (block 0 unused)
        order = (torch.randperm(slots * cap // block, generator=gen) + 1).view(slots, -1)
        pool_k, pool_v = (torch.zeros(slots * cap // block + 1, n_kv, block, dim) for _ in "kv")
        for row in range(slots):
            for b, at in enumerate(order[row].tolist()):
                pool_k[at] = kc[row, :, b * block : (b + 1) * block]
                pool_v[at] = vc[row, :, b * block : (b + 1) * block]
        kc, vc = pool_k, pool_v
        table = torch.cat([order, torch.zeros(slots, 1, dtype=order.dtype)], 1).int()
    to = {"device": DEVICE}
    out = triton_attention.prefill_attention(
        q.to(**to),
        kc.to(**to),
        vc.to(**to),
        torch.tensor(pos, **to),
        torch.tensor(tiles, dtype=torch.int32, **to),
        0.25,
        None if table is None else table.to(**to),
        max_keys=max(pos) + 1,
        launch=launch,
    )
    torch.testing.assert_close(out.cpu(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block", [8, 64])
def test_paged_kernels_equal_the_torch_path_through_block_tables(block: int) -> None:
    """A paged cache (kv_cache.py) with scattered, out-of-order blocks: the kernel prefill
    (rope + cache writes at (block, offset)) and decode step (attention reading each key's
    block from the row's table, keys split across programs, a tile spanning several blocks
    when they are small) give the torch path's logits and cache cells; a padded row at the
    scratch position reads nothing."""
    lengths = [191, 63, 64, 1]
    gen = torch.Generator().manual_seed(8)
    prompts = [torch.randint(3, 500, (n,), generator=gen).tolist() for n in lengths]
    need = [-(-(n + 1) // block) for n in lengths]
    order = (torch.randperm(sum(need) + 4, generator=gen) + 1).tolist()
    tables, at = [], 0
    for n in need:
        tables.append(order[at : at + n])
        at += n
    ids = torch.randint(3, 500, (5,), generator=gen).to(DEVICE)
    dec = Decoder(model("qwen3"), 300)
    results = []
    for kernels in (False, True):
        if kernels:
            enable_kernels(dec)
        cache = dec.new_paged_cache(rows=5, blocks=sum(need) + 5, block=block)
        for row, table in enumerate(tables):
            cache.set_row(row, table)
        logits = dec.prefill(cache, [0, 1, 2, 3], [0] * 4, prompts, [n - 1 for n in lengths])
        pos = torch.tensor([*lengths, cache.capacity - 1], device=DEVICE)  # row 4: padding
        step = dec.decode(cache, ids, pos, 192)
        keys = [cache.keys(cache.k[0], torch.tensor([r]), n + 1) for r, n in enumerate(lengths)]
        results.append((torch.cat(logits), step[:4], keys))
    (ref_pre, ref_step, ref_keys), (pre, step, keys) = results
    torch.testing.assert_close(pre, ref_pre, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(step, ref_step, atol=1e-4, rtol=1e-4)
    for a, b in zip(keys, ref_keys, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)

"""The token pick of the Triton decode step: per row, the argmax or a temperature draw and its
logprob, in one pass over the logits; multi-step replays and the per-step path both use it, so a
row's draw never depends on the path its batch took. Design: docs/engine.md#sampling
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stacx.inference.triton_attention import TARGET_PROGRAMS

PICK_BLOCK = 1024


def pick_splits(rows: int, vocab: int) -> int:
    """Vocabulary ranges per row: ~2 x `TARGET_PROGRAMS` programs, at most 64, each at least four
    blocks; a power of two, since the split count specializes the kernels (a first pick of a new
    row count would otherwise build them again: rows 54 to 64 give seven counts at Qwen3's
    vocabulary, all 32 as powers of two)."""
    most = max(
        1, min(64, triton.cdiv(vocab, 4 * PICK_BLOCK), triton.cdiv(2 * TARGET_PROGRAMS, rows))
    )
    return 1 << (most.bit_length() - 1)


@triton.jit
def _pick_partial_kernel(
    LOGITS,
    TEMP,
    SEED,
    POS,
    PMAX,
    PSUM,
    PBEST,
    PIDX,
    PVAL,
    vocab,
    stride,
    SPLITS: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
    SAMPLE: tl.constexpr,
):
    row = tl.program_id(0)
    s = tl.program_id(1)
    m = tl.full([], float("-inf"), tl.float32)  # the raw logits' max and sum of exp: the logprob
    total = tl.zeros([], tl.float32)
    best = tl.full([], float("-inf"), tl.float32)  # the pick's score: the logit, or its race
    idx = tl.zeros([], tl.int32)
    val = tl.full([], float("-inf"), tl.float32)  # the raw logit at idx
    if SAMPLE:
        temp = tl.load(TEMP + row)
        seed = tl.load(SEED + row)
        counter = tl.load(POS + row).to(tl.int64) * 4294967296  # (position, token id) counters
    for start in range(0, CHUNK, BLOCK):
        cols = s * CHUNK + start + tl.arange(0, BLOCK)
        x = tl.load(LOGITS + row * stride + cols, mask=cols < vocab, other=float("-inf")).to(
            tl.float32
        )
        top = tl.max(x, axis=0)
        new = tl.maximum(m, top)
        safe = tl.where(new == float("-inf"), 0.0, new)
        total = total * tl.exp(m - safe) + tl.sum(tl.exp(x - safe), axis=0)
        m = new
        score = x
        if SAMPLE:  # Gumbel-max: argmax(x / T - log(-log(u))) is a draw from softmax(x / T)
            u = tl.rand(seed, counter + cols)
            race = x / tl.where(temp > 0, temp, 1.0) - tl.log(-tl.log(u))
            score = tl.where(temp > 0, race, x)
        at = tl.argmax(score, axis=0, tie_break_left=True)
        hi = tl.max(score, axis=0)
        picked = tl.sum(tl.where(tl.arange(0, BLOCK) == at, x, 0.0), axis=0)
        take = hi > best  # strictly greater: the first index of a tie wins
        idx = tl.where(take, at + s * CHUNK + start, idx)
        val = tl.where(take, picked, val)
        best = tl.maximum(best, hi)
    out = row * SPLITS + s
    tl.store(PMAX + out, m)
    tl.store(PSUM + out, total)
    tl.store(PBEST + out, best)
    tl.store(PIDX + out, idx)
    tl.store(PVAL + out, val)


@triton.jit
def _pick_combine_kernel(
    PMAX,
    PSUM,
    PBEST,
    PIDX,
    PVAL,
    TOK,
    OUT_TOK,
    OUT_LP,
    SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    row = tl.program_id(0)
    sp = tl.arange(0, SPLITS_PAD)
    live = sp < SPLITS
    m = tl.load(PMAX + row * SPLITS + sp, mask=live, other=float("-inf"))
    total = tl.load(PSUM + row * SPLITS + sp, mask=live, other=0.0)
    bs = tl.load(PBEST + row * SPLITS + sp, mask=live, other=float("-inf"))
    idx = tl.load(PIDX + row * SPLITS + sp, mask=live, other=2**30)
    val = tl.load(PVAL + row * SPLITS + sp, mask=live, other=0.0)
    top = tl.max(m, axis=0)
    lse = top + tl.log(tl.sum(total * tl.exp(m - top), axis=0))
    hi = tl.max(bs, axis=0)
    pick = tl.min(tl.where(bs == hi, idx, 2**30), axis=0)  # the first index holding the best
    logit = tl.sum(tl.where(idx == pick, val, 0.0), axis=0)
    tl.store(TOK + row, pick.to(tl.int64))
    tl.store(OUT_TOK + row, pick.to(tl.float32))
    tl.store(OUT_LP + row, logit - lse)


def pick(
    logits: torch.Tensor,
    out_tok: torch.Tensor,
    out_lp: torch.Tensor,
    sample: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Per row of ``logits`` [B, V]: the token and its raw-logit ``log_softmax``, written to
    ``out_tok`` (float32) and ``out_lp``, returned as int64 [B]. Greedy (``sample`` None or T 0):
    the argmax, first index of a tie. ``sample`` = (temperature, seed, position) per row."""
    rows, vocab = logits.shape
    splits = pick_splits(rows, vocab)
    chunk = triton.cdiv(triton.cdiv(vocab, splits), PICK_BLOCK) * PICK_BLOCK
    dev = logits.device
    pmax, psum, pbest, pval = (
        torch.empty(rows, splits, dtype=torch.float32, device=dev) for _ in range(4)
    )
    pidx = torch.empty(rows, splits, dtype=torch.int32, device=dev)
    tok = torch.empty(rows, dtype=torch.int64, device=dev)
    temp, seed, pos = sample if sample is not None else (pmax, pidx, pidx)
    _pick_partial_kernel[(rows, splits)](
        logits,
        temp,
        seed,
        pos.contiguous(),
        pmax,
        psum,
        pbest,
        pidx,
        pval,
        vocab,
        logits.stride(0),
        SPLITS=splits,
        CHUNK=chunk,
        BLOCK=PICK_BLOCK,
        SAMPLE=sample is not None,
    )
    _pick_combine_kernel[(rows,)](
        pmax,
        psum,
        pbest,
        pidx,
        pval,
        tok,
        out_tok,
        out_lp,
        SPLITS=splits,
        SPLITS_PAD=triton.next_power_of_2(splits),
    )
    return tok

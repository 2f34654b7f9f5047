"""Triton attention kernels of the hand-written CUDA step over either KV-cache layout: decode
(one query per row, keys split across programs, `decode_attention`) and prefill (many queries
per row, each tile's queries sharing its key reads, `prefill_attention`).

Every kernel also runs under Triton's CPU interpreter. Design: docs/engine.md#the-kernels
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from stacx.inference.triton_kernels import INTERPRET, after_previous, pdl

BLOCK_N = 64  # keys per attention tile
# Split the keys until the grid has this many programs (~8 per SM on an H100): rows of uneven
# lengths then end together, and few partials are merged. tools/bench/decode_attention.py on an
# H100 (2026-12-07, paged, 64 rows): 500 to 5,000 keys 261 us (0.98 of the copy bandwidth) at
# 1,024 (2 splits) against 266 us (0.97) at 4,096 (8 splits); 256 to 512 keys 42.1 us (0.80)
# against 47.9 us (0.70)
TARGET_PROGRAMS = 1024


@triton.jit
def _attend_tile(
    q,
    qpos,
    cache,
    start,
    hi,
    scale,
    state,
    d,
    BLOCK: tl.constexpr,
    CAUSAL: tl.constexpr,
    F32_DOT: tl.constexpr,
    PAGE: tl.constexpr,
):
    """One tile of keys [start, start + BLOCK) (those < hi) into the online softmax ``state``
    (max, sum, output) of the queries ``q``; CAUSAL: key n is seen by the queries at positions
    ``qpos`` n or later. ``cache``: (k base, v base, block table, slot stride, position stride);
    PAGE > 0: key n lives in block ``table[n // PAGE]`` at offset ``n % PAGE`` (a paged cache)."""
    kbase, vbase, tbl, kc_slot, kc_pos = cache
    m_i, l_i, acc = state
    n = start + tl.arange(0, BLOCK)
    valid = n < hi
    if PAGE == 0:
        offs = n[:, None] * kc_pos + d[None, :]
    else:
        blk = tl.load(tbl + n // PAGE, mask=valid, other=0).to(tl.int64)
        offs = blk[:, None] * kc_slot + (n % PAGE)[:, None] * kc_pos + d[None, :]
    k = tl.load(kbase + offs, mask=valid[:, None], other=0.0)
    v = tl.load(vbase + offs, mask=valid[:, None], other=0.0)
    if F32_DOT:
        qk = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        qk = tl.dot(q, tl.trans(k))
    seen = valid[None, :]
    if CAUSAL:
        seen = seen & (n[None, :] <= qpos[:, None])
    qk = tl.where(seen, qk * scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if F32_DOT:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc * alpha[:, None] + pv


@triton.jit
def _attend_keys(
    q,
    qpos,
    cache,
    lo,
    hi,
    scale,
    d,
    ROWS: tl.constexpr,
    LIMIT: tl.constexpr,
    BLOCK: tl.constexpr,
    CAUSAL: tl.constexpr,
    F32_DOT: tl.constexpr,
    INTERPRETED: tl.constexpr,
    PAGE: tl.constexpr,
):
    """The online softmax (max, sum, output) of the queries ``q`` [ROWS, D] over keys
    [lo, hi), a tile at a time (`_attend_tile`); LIMIT: a bound on ``hi - lo`` (interpreted)."""
    state = (
        tl.full([ROWS], float("-inf"), tl.float32),
        tl.zeros([ROWS], tl.float32),
        tl.zeros([ROWS, q.shape[1]], tl.float32),
    )
    if INTERPRETED:  # the interpreter takes no tensor loop bounds: skip tiles past hi
        for start in range(0, LIMIT, BLOCK):
            if lo + start < hi:
                state = _attend_tile(
                    q, qpos, cache, lo + start, hi, scale, state, d, BLOCK, CAUSAL, F32_DOT, PAGE
                )
    else:
        for start in range(lo, hi, BLOCK):
            state = _attend_tile(
                q, qpos, cache, start, hi, scale, state, d, BLOCK, CAUSAL, F32_DOT, PAGE
            )
    return state


@triton.jit(do_not_specialize=["keys", "splits"])  # one compile for every length
def _decode_attn_kernel(
    Q,
    KC,
    VC,
    POS,
    OUT,
    PO,
    PM,
    PL,
    TABLE,
    keys,
    scale,
    kc_slot,
    kc_head,
    kc_pos,
    table_stride,
    splits,
    N_HEADS: tl.constexpr,
    REP: tl.constexpr,
    REP_PAD: tl.constexpr,
    DIM: tl.constexpr,
    BLOCK: tl.constexpr,
    ONE_SPLIT: tl.constexpr,
    LIMIT: tl.constexpr,
    F32_DOT: tl.constexpr,
    INTERPRETED: tl.constexpr,
    PAGE: tl.constexpr,
    PDL: tl.constexpr,
):
    after_previous(PDL)
    b = tl.program_id(0)
    g = tl.program_id(1)
    s = tl.program_id(2)
    r = tl.arange(0, REP_PAD)
    d = tl.arange(0, DIM)
    heads = g * REP + r
    q = tl.load(
        Q + (b * N_HEADS + heads)[:, None] * DIM + d[None, :], mask=(r < REP)[:, None], other=0.0
    )
    pos = tl.load(POS + b)
    length = tl.where(pos < keys, pos + 1, 0)  # a padded row sits at the scratch cell: no keys
    chunk = tl.cdiv(tl.cdiv(length, splits), BLOCK) * BLOCK  # this row's keys, split evenly
    lo = s * chunk
    hi = tl.minimum(lo + chunk, length)
    at = (b * kc_slot if PAGE == 0 else 0) + g * kc_head  # paged: blocks from row b's table
    cache = (KC + at, VC + at, TABLE + b * table_stride, kc_slot, kc_pos)
    m_i, l_i, acc = _attend_keys(
        q, pos, cache, lo, hi, scale, d, REP_PAD, LIMIT, BLOCK, False, F32_DOT, INTERPRETED, PAGE
    )
    rmask = (r < REP)[:, None]
    if ONE_SPLIT:
        out = (acc / tl.where(l_i > 0, l_i, 1.0)[:, None]).to(OUT.dtype.element_ty)
        tl.store(OUT + (b * N_HEADS + heads)[:, None] * DIM + d[None, :], out, mask=rmask)
    else:
        part = (b * N_HEADS + heads) * splits + s  # [B, H, splits] partials
        # a range past the row's keys stores its max (-inf) and sum (0) only: never merged
        tl.store(PO + part[:, None] * DIM + d[None, :], acc, mask=rmask & (lo < hi))
        tl.store(PM + part, m_i, mask=r < REP)
        tl.store(PL + part, l_i, mask=r < REP)


COMBINE_TILE = 16  # partials the combine reads per iteration: one build for every split count


@triton.jit
def _merge_tile(PO, PM, PL, bh, splits, first, state, d, TILE: tl.constexpr, DIM: tl.constexpr):
    """Fold partials ``[first, first + TILE)`` of (row, head) ``bh`` into the running (max, sum,
    output) ``state``."""
    top, total, acc = state
    sp = first + tl.arange(0, TILE)
    live = sp < splits
    m = tl.load(PM + bh * splits + sp, mask=live, other=float("-inf"))
    new_top = tl.maximum(top, tl.max(m, axis=0))
    keep = tl.exp(top - new_top)
    w = tl.exp(m - new_top)
    total = total * keep + tl.sum(tl.load(PL + bh * splits + sp, mask=live, other=0.0) * w)
    used = (live & (m > float("-inf")))[:, None]  # an empty range wrote no output
    part = tl.load(PO + (bh * splits + sp)[:, None] * DIM + d[None, :], mask=used, other=0.0)
    return new_top, total, acc * keep + tl.sum(part * w[:, None], axis=0)


@triton.jit(do_not_specialize=["splits"])
def _combine_kernel(
    PO,
    PM,
    PL,
    OUT,
    splits,
    TILE: tl.constexpr,
    DIM: tl.constexpr,
    LIMIT: tl.constexpr,
    INTERPRETED: tl.constexpr,
    PDL: tl.constexpr,
):
    """Merge a (row, head)'s `splits` partials, `TILE` at a time with a running max, so the split
    count is a runtime argument (a cold engine builds this once, not once per power of two it
    meets). ``LIMIT``: the split count, the interpreter's loop bound (it takes no tensor one)."""
    after_previous(PDL)
    bh = tl.program_id(0)
    d = tl.arange(0, DIM)
    state = (  # the max starts finite: a row with no keys (padded) sums to zeros
        tl.full((), -1.0e30, tl.float32),
        tl.zeros((), tl.float32),
        tl.zeros((DIM,), tl.float32),
    )
    if INTERPRETED:
        for first in range(0, LIMIT, TILE):
            state = _merge_tile(PO, PM, PL, bh, splits, first, state, d, TILE, DIM)
    else:
        for first in range(0, splits, TILE):
            state = _merge_tile(PO, PM, PL, bh, splits, first, state, d, TILE, DIM)
    _, total, acc = state
    out = acc / tl.where(total > 0, total, 1.0)
    tl.store(OUT + bh * DIM + d, out.to(OUT.dtype.element_ty))


def attention_splits(
    batch: int, n_kv: int, keys: int, block: int = BLOCK_N, target: int = TARGET_PROGRAMS
) -> int:
    """How many key ranges each (row, kv head) is split into for a step reading at most `keys`
    keys: enough for ~`target` programs, and no more than the power of two at or above the keys'
    tiles of `block` (so the counts a batch meets as its contexts grow are few: each is a CUDA
    graph). Each row splits its own keys evenly over them, whole tiles each."""
    tiles = triton.next_power_of_2(triton.cdiv(keys, block))
    return max(1, min(triton.cdiv(target, batch * n_kv), tiles))


def most_splits_keys(
    batch: int, n_kv: int, block: int = BLOCK_N, target: int = TARGET_PROGRAMS
) -> int:
    """The fewest keys at which `attention_splits` gives `batch` rows its most splits: past it,
    one decode graph per batch bucket serves every context length (the engine's warm-up
    captures it there)."""
    return block * triton.cdiv(target, batch * n_kv)


class DecodeLaunch(NamedTuple):
    """How `decode_attention` launches: keys per tile, warps, pipeline stages, target programs.
    Keys, warps and stages: within 1 % of the best of 33 swept on an H100 (64 rows of 500 to
    5,000 keys, docs/benchmarks.md; tools/bench/decode_attention.py ``--configs``); 8 warps,
    1 stage: 25 % slower. Target programs: `TARGET_PROGRAMS`."""

    block: int = BLOCK_N
    warps: int = 4
    stages: int = 2  # H200, 64 rows x 500 keys: 34.4 us vs 38.3 at 3
    target: int = TARGET_PROGRAMS


def _split_partials(
    out: torch.Tensor, splits: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each key range's partial output, running max and sum (fp32) for `_combine_kernel` to
    merge into `out` [B, H, D]; one range writes `out` directly (the three are `out`)."""
    if splits <= 1:
        return out, out, out
    batch, n_heads, dim = out.shape
    po = torch.empty(batch, n_heads, splits, dim, dtype=torch.float32, device=out.device)
    pm = torch.empty(batch, n_heads, splits, dtype=torch.float32, device=out.device)
    return po, pm, torch.empty_like(pm)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pos: torch.Tensor,
    keys: int,
    scale: float,
    table: torch.Tensor | None = None,
    splits: int | None = None,
    launch: DecodeLaunch = DecodeLaunch(),
) -> torch.Tensor:
    """One query per row, ``q`` [B, H, D] -> [B, H, D]: row b attends to slot b's keys
    ``[0, pos[b]]`` (none, zeros, if ``pos[b] >= keys``); ``table``: a paged cache's block
    tables; ``splits``: the ranges each row's keys are split into, evenly, whatever its length
    (default `attention_splits`; a CUDA graph fixes them while its rows' contexts grow)."""
    batch, n_heads, dim = q.shape
    n_kv = k_cache.shape[1]
    rep = n_heads // n_kv
    splits = splits or attention_splits(batch, n_kv, keys, launch.block, launch.target)
    out = torch.empty_like(q)
    po, pm, pl = _split_partials(out, splits)
    _decode_attn_kernel[(batch, n_kv, splits)](
        q,
        k_cache,
        v_cache,
        pos,
        out,
        po,
        pm,
        pl,
        pos if table is None else table,
        keys,
        scale,
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        0 if table is None else table.stride(0),
        splits,
        N_HEADS=n_heads,
        REP=rep,
        REP_PAD=max(16, triton.next_power_of_2(rep)),
        DIM=dim,
        BLOCK=launch.block,
        ONE_SPLIT=splits == 1,
        # the interpreter's bound on a range's keys; compiled: one kernel for every count
        LIMIT=triton.cdiv(triton.cdiv(keys, splits), launch.block) * launch.block
        if INTERPRET
        else 0,
        F32_DOT=q.dtype == torch.float32 or INTERPRET,
        INTERPRETED=INTERPRET,
        PAGE=0 if table is None else k_cache.shape[2],
        num_warps=launch.warps,
        num_stages=launch.stages,
        **pdl(),
    )
    if splits > 1:
        _combine_kernel[(batch * n_heads,)](
            po,
            pm,
            pl,
            out,
            splits,
            TILE=COMBINE_TILE,
            DIM=dim,
            LIMIT=splits if INTERPRET else 0,
            INTERPRETED=INTERPRET,
            **pdl(),
        )
    return out


class PrefillLaunch(NamedTuple):
    """How `prefill_attention` launches: (token, head) pairs per program (``rows // rep``
    consecutive tokens of one row, each with the ``rep`` query heads of one kv head: a program
    reads its row's keys once for all of them), keys per tile, warps, pipeline stages."""

    rows: int = 64
    block: int = BLOCK_N
    warps: int = 4
    stages: int = 3


PREFILL = PrefillLaunch()  # the engine's (its flat prefill pieces are tiled to match)


def prefill_tile_tokens(rep: int, launch: PrefillLaunch | None = None) -> int:
    """Tokens per prefill-attention tile: a tile is at most this many consecutive new tokens of
    one row, each with its ``rep`` query heads of one kv head (``launch.rows`` pairs; None: the
    module's `PREFILL`, read at the call)."""
    return max(1, (launch or PREFILL).rows // rep)


@triton.jit
def _prefill_attn_kernel(
    Q,
    KC,
    VC,
    POS,
    TILES,
    OUT,
    TABLE,
    scale,
    kc_slot,
    kc_head,
    kc_pos,
    table_stride,
    N_HEADS: tl.constexpr,
    REP: tl.constexpr,
    DIM: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    F32_DOT: tl.constexpr,
    INTERPRETED: tl.constexpr,
    MAX_KEYS: tl.constexpr,
    PAGE: tl.constexpr,
):
    j = tl.program_id(0)
    g = tl.program_id(1)
    row = tl.load(TILES + j * 3).to(tl.int64)
    first = tl.load(TILES + j * 3 + 1)
    count = tl.load(TILES + j * 3 + 2)
    i = tl.arange(0, ROWS)
    d = tl.arange(0, DIM)
    live = i // REP < count
    t = first + i // REP
    heads = g * REP + i % REP
    q = tl.load(
        Q + (t * N_HEADS + heads)[:, None] * DIM + d[None, :], mask=live[:, None], other=0.0
    )
    qpos = tl.load(POS + t, mask=live, other=0)  # a dead pair sees key 0: finite, not stored
    hi = tl.where(count > 0, tl.max(qpos, axis=0) + 1, 0)
    at = (row * kc_slot if PAGE == 0 else 0) + g * kc_head  # paged: blocks from row's table
    cache = (KC + at, VC + at, TABLE + row * table_stride, kc_slot, kc_pos)
    _, l_i, acc = _attend_keys(
        q, qpos, cache, 0, hi, scale, d, ROWS, MAX_KEYS, BLOCK, True, F32_DOT, INTERPRETED, PAGE
    )
    out = (acc / tl.where(l_i > 0, l_i, 1.0)[:, None]).to(OUT.dtype.element_ty)
    tl.store(OUT + (t * N_HEADS + heads)[:, None] * DIM + d[None, :], out, mask=live[:, None])


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pos: torch.Tensor,
    tiles: torch.Tensor,
    scale: float,
    table: torch.Tensor | None = None,
    max_keys: int = 0,
    launch: PrefillLaunch | None = None,
) -> torch.Tensor:
    """Many queries per row, ``q`` [T, H, D] -> [T, H, D]: token t attends to its row's keys
    ``[0, pos[t]]`` (its own and the earlier new tokens' already written). ``tiles`` [J, 3]
    int: (row, first token, count) runs of at most ``prefill_tile_tokens(rep, launch)``
    consecutive tokens of one row (count 0: an unused tile); a row is its slot, or its line of the paged ``table``.
    Each program reads its row's keys once for all its queries. ``max_keys``: a bound on
    ``pos + 1`` (the interpreter's loop; compiled kernels read ``pos``)."""
    launch = launch or PREFILL
    _, n_heads, dim = q.shape
    n_kv = k_cache.shape[1]
    rep = n_heads // n_kv
    out = torch.empty_like(q)
    _prefill_attn_kernel[(tiles.shape[0], n_kv)](
        q,
        k_cache,
        v_cache,
        pos,
        tiles,
        out,
        pos if table is None else table,
        scale,
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        0 if table is None else table.stride(0),
        N_HEADS=n_heads,
        REP=rep,
        DIM=dim,
        ROWS=triton.next_power_of_2(prefill_tile_tokens(rep, launch) * rep),
        BLOCK=launch.block,
        F32_DOT=q.dtype == torch.float32 or INTERPRET,
        INTERPRETED=INTERPRET,
        MAX_KEYS=triton.cdiv(max(max_keys, 1), launch.block) * launch.block if INTERPRET else 0,
        PAGE=0 if table is None else k_cache.shape[2],
        num_warps=launch.warps,
        num_stages=launch.stages,
    )
    return out

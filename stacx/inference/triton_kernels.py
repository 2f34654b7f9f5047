"""Triton kernels of the hand-written CUDA decode step (decoder_kernels.py).

Fewer launches and reads than the torch-op step (attention reads only each row's valid keys),
with transformers' eager numerics op by op; every kernel also runs under Triton's CPU interpreter.
Importing this module needs ``triton``. Design: docs/engine.md#the-kernels
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

# Triton's interpreter multiplies bf16 operands of tl.dot as raw bits (3.6.0): upcast there
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# programmatic dependent launch on sm90+ (STACX_PDL=0 turns it off; the engine benches' A/B
# sets it): a decode kernel launches while the one before it finishes and waits in-kernel for
# its writes (`after_previous`), so a replay's ~200 short kernels no longer pay a launch and a
# ramp each, and a projection reads its first weight tile before that wait
PDL = os.environ.get("STACX_PDL", "1") != "0"
PDL_DRIVER = 12030  # CUDA 12.3: stream capture keeps programmatic edges (graphs of PDL kernels)


@functools.cache
def cuda_driver_version() -> int:
    """The CUDA driver's version (12030 for 12.3; 0 where libcuda cannot be loaded)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    version = ctypes.c_int(0)
    return version.value if lib.cuDriverGetVersion(ctypes.byref(version)) == 0 else 0


def pdl() -> dict[str, bool]:
    """The launch options of a kernel that calls `after_previous`: ``launch_pdl`` where `PDL`
    is on and Triton builds for an sm90+ CUDA target whose driver captures it in CUDA graphs
    (`PDL_DRIVER`; never under Triton's interpreter)."""
    if not PDL or INTERPRET:
        return {"PDL": False}
    target = triton.runtime.driver.active.get_current_target()
    on = target.backend == "cuda" and isinstance(target.arch, int) and target.arch >= 90
    on = on and cuda_driver_version() >= PDL_DRIVER
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}


@triton.jit
def after_previous(PDL: tl.constexpr):
    """Under programmatic dependent launch: wait until the kernel before has finished and its
    writes are visible (nothing but weights may be read, and nothing written, before this), then
    let the next kernel launch; its programs wait here in turn."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _add_rmsnorm_kernel(
    X,
    R,
    RB,
    W,
    Y,
    XO,
    n_cols,
    stride,
    part_stride,
    eps,
    HAS_RES: tl.constexpr,
    PARTS: tl.constexpr,
    HAS_RB: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)  # a weight: before the wait
    after_previous(PDL)
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0)
    dt = XO.dtype.element_ty
    if HAS_RES:
        if PARTS == 0:
            r = tl.load(R + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        else:  # a split-K GEMM's fp32 partial sums (+ its bias), rounded as F.linear's output
            acc = tl.zeros([BLOCK], tl.float32)
            for p in tl.static_range(PARTS):
                acc += tl.load(R + p * part_stride + row * n_cols + cols, mask=mask, other=0.0)
            if HAS_RB:
                acc += tl.load(RB + cols, mask=mask, other=0.0).to(tl.float32)
            r = acc.to(dt).to(tl.float32)
        x = (x.to(tl.float32) + r).to(dt)
        tl.store(XO + row * stride + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    xn = (xf * rstd).to(Y.dtype.element_ty).to(tl.float32)
    tl.store(Y + row * stride + cols, (w * xn).to(Y.dtype.element_ty), mask=mask)


class Partials(NamedTuple):
    """A split-K GEMM's output before its sum: fp32 ``parts`` [splits, rows, n_out] and the
    bias still to add; `add_rmsnorm` takes it as its residual."""

    parts: torch.Tensor
    bias: torch.Tensor | None


def add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor | Partials | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x + residual, rmsnorm(x + residual) * weight)`` (no residual: ``x``); ``x`` [..., hidden]
    contiguous; a `Partials` residual is summed and rounded to x's dtype first."""
    n_cols = x.shape[-1]
    rows = x.numel() // n_cols
    y = torch.empty_like(x)
    xo = torch.empty_like(x) if residual is not None else x
    parts = residual if isinstance(residual, Partials) else None
    r = x if residual is None else (parts.parts if parts is not None else residual)
    rb = parts.bias if parts is not None and parts.bias is not None else weight
    _add_rmsnorm_kernel[(rows,)](
        x,
        r,
        rb,
        weight,
        y,
        xo,
        n_cols,
        n_cols,
        rows * n_cols,
        eps,
        HAS_RES=residual is not None,
        PARTS=0 if parts is None else parts.parts.shape[0],
        HAS_RB=parts is not None and parts.bias is not None,
        BLOCK=triton.next_power_of_2(n_cols),
        **pdl(),
    )
    return xo, y


@triton.jit
def _rope_cache_kernel(
    QKV,
    Q,
    KC,
    VC,
    COS,
    SIN,
    POS,
    SLOT,
    CELL,
    QNW,
    KNW,
    qkv_stride,
    kc_slot,
    kc_head,
    kc_pos,
    eps,
    N_HEADS: tl.constexpr,
    N_KV: tl.constexpr,
    HALF: tl.constexpr,
    QK_NORM: tl.constexpr,
    ROW_SLOTS: tl.constexpr,
    HEADS: tl.constexpr,
    PDL: tl.constexpr,
):
    after_previous(PDL)
    t = tl.program_id(0)
    # HEADS of token t's heads: [0, H) q heads, [H, H + Hkv) k heads, then the v heads
    j = tl.program_id(1) * HEADS + tl.arange(0, HEADS)
    d = tl.arange(0, HALF)
    dim = 2 * HALF
    is_q = j < N_HEADS
    is_k = (j >= N_HEADS) & (j < N_HEADS + N_KV)
    is_v = (j >= N_HEADS + N_KV) & (j < N_HEADS + 2 * N_KV)
    roped = (is_q | is_k)[:, None]
    pos = tl.load(POS + t)
    base = QKV + t * qkv_stride + j[:, None] * dim + d[None, :]
    live = (j < N_HEADS + 2 * N_KV)[:, None]
    x1 = tl.load(base, mask=live, other=0.0)
    x2 = tl.load(base + HALF, mask=live, other=0.0)
    dt = Q.dtype.element_ty
    r1, r2 = x1, x2  # the heads' values as they are: a v head's
    if QK_NORM:
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        rstd = 1.0 / tl.sqrt((tl.sum(f1 * f1, axis=1) + tl.sum(f2 * f2, axis=1)) / dim + eps)
        qw1, qw2 = tl.load(QNW + d).to(tl.float32), tl.load(QNW + HALF + d).to(tl.float32)
        kw1, kw2 = tl.load(KNW + d).to(tl.float32), tl.load(KNW + HALF + d).to(tl.float32)
        w1 = tl.where(is_q[:, None], qw1[None, :], kw1[None, :])
        w2 = tl.where(is_q[:, None], qw2[None, :], kw2[None, :])
        x1 = (w1 * (f1 * rstd[:, None]).to(dt).to(tl.float32)).to(dt)
        x2 = (w2 * (f2 * rstd[:, None]).to(dt).to(tl.float32)).to(dt)
    f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
    c1 = tl.load(COS + pos * dim + d).to(tl.float32)[None, :]
    c2 = tl.load(COS + pos * dim + HALF + d).to(tl.float32)[None, :]
    s1 = tl.load(SIN + pos * dim + d).to(tl.float32)[None, :]
    s2 = tl.load(SIN + pos * dim + HALF + d).to(tl.float32)[None, :]
    # q * cos + rotate_half(q) * sin, rounded per op as the torch expression is
    o1 = ((f1 * c1).to(dt).to(tl.float32) + (-f2 * s1).to(dt).to(tl.float32)).to(dt)
    o2 = ((f2 * c2).to(dt).to(tl.float32) + (f1 * s2).to(dt).to(tl.float32)).to(dt)
    o1 = tl.where(roped, o1, r1)
    o2 = tl.where(roped, o2, r2)
    q_out = Q + (t * N_HEADS + j)[:, None] * dim + d[None, :]
    tl.store(q_out, o1, mask=is_q[:, None])
    tl.store(q_out + HALF, o2, mask=is_q[:, None])
    slot = t if ROW_SLOTS else tl.load(SLOT + t)
    kv = tl.where(is_k, j - N_HEADS, j - N_HEADS - N_KV)
    at = tl.load(CELL + t)  # the position in the slot (paged: the offset in the block)
    cell = slot.to(tl.int64) * kc_slot + kv[:, None] * kc_head + at * kc_pos + d[None, :]
    tl.store(KC + cell, o1, mask=is_k[:, None])
    tl.store(KC + cell + HALF, o2, mask=is_k[:, None])
    tl.store(VC + cell, o1, mask=is_v[:, None])
    tl.store(VC + cell + HALF, o2, mask=is_v[:, None])


def rope_cache(
    qkv: torch.Tensor,
    pos: torch.Tensor,
    slot: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    n_heads: int,
    n_kv: int,
    q_norm: tuple[torch.Tensor, torch.Tensor, float] | None,
    heads: int | None = None,
    cell: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, H, D] from ``qkv`` [T, (H + 2 Hkv) * D] with ``q_norm`` (q/k weights, eps; or None)
    and rope applied; writes k and v into the caches at ``(slot[t], pos[t])`` (``slot`` None:
    t; ``cell``: the paged offset instead of ``pos[t]``). ``heads``: heads per program (pow2)."""
    tokens, dim = qkv.shape[0], k_cache.shape[-1]
    pos = pos.contiguous()  # the kernel reads pos[t] and slot[t] at t's offset
    slot = None if slot is None else slot.contiguous()
    cell = pos if cell is None else cell.contiguous()
    q = torch.empty(tokens, n_heads, dim, dtype=qkv.dtype, device=qkv.device)
    qw, kw, eps = q_norm if q_norm is not None else (cos, cos, 0.0)
    total = n_heads + 2 * n_kv
    # many tokens (a prefill): one program per token; few (a decode step): more programs
    heads = heads or min(triton.next_power_of_2(total), 32 if tokens > 256 else 4)
    _rope_cache_kernel[(tokens, triton.cdiv(total, heads))](
        qkv,
        q,
        k_cache,
        v_cache,
        cos,
        sin,
        pos,
        pos if slot is None else slot,
        cell,
        qw,
        kw,
        qkv.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        eps,
        N_HEADS=n_heads,
        N_KV=n_kv,
        HALF=dim // 2,
        QK_NORM=q_norm is not None,
        ROW_SLOTS=slot is None,
        HEADS=heads,
        **pdl(),
    )
    return q


@triton.jit
def _silu_mul_kernel(GU, OUT, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    dt = OUT.dtype.element_ty
    g = tl.load(GU + row * 2 * inter + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(GU + row * 2 * inter + inter + cols, mask=mask, other=0.0).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
    tl.store(OUT + row * inter + cols, (act * u).to(dt), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up`` [..., 2I] (gate columns first), contiguous."""
    inter = gate_up.shape[-1] // 2
    rows = gate_up.numel() // (2 * inter)
    out = torch.empty(*gate_up.shape[:-1], inter, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(rows, triton.cdiv(inter, block))](gate_up, out, inter, BLOCK=block)
    return out


@triton.jit
def _gemv_x(X, NW, m, mrow, k, kin, x_stride, rstd, dt, NORM: tl.constexpr):
    """Input rows' keys ``k`` in fp32, RMS-normed (``rstd``, weight NW) if NORM."""
    x = tl.load(X + m[:, None] * x_stride + k[None, :], mask=mrow & kin[None, :], other=0.0)
    x = x.to(tl.float32)
    if NORM:
        nw = tl.load(NW + k, mask=kin, other=0.0).to(tl.float32)
        x = (nw[None, :] * (x * rstd[:, None]).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    return x


@triton.jit
def _gemv_kernel(
    X,
    W,
    BIAS,
    RES,
    Y,
    NW,
    rows,
    n_out,
    x_stride,
    eps,
    N_IN: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NORM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_RES: tl.constexpr,
    GLU: tl.constexpr,
    PDL: tl.constexpr,
):
    dt = Y.dtype.element_ty
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    live = n < n_out
    m = tl.arange(0, ROWS)
    mrow = (m < rows)[:, None]
    # the first tile of weights is read before waiting on the kernel that writes X
    k = tl.arange(0, BLOCK_K)
    kin = k < N_IN
    wmask = live[:, None] & kin[None, :]
    w = tl.load(W + n[:, None] * N_IN + k[None, :], mask=wmask, other=0.0)
    if GLU:
        wu = tl.load(W + (n + n_out)[:, None] * N_IN + k[None, :], mask=wmask, other=0.0)
    else:
        wu = w
    after_previous(PDL)
    rstd = tl.zeros([ROWS], tl.float32)
    if NORM:  # the RMSNorm of each input row, folded in front of the product
        sq = tl.zeros([ROWS, BLOCK_K], tl.float32)
        for k0 in range(0, N_IN, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            xk = tl.load(
                X + m[:, None] * x_stride + kk[None, :],
                mask=mrow & (kk < N_IN)[None, :],
                other=0.0,
            )
            sq += xk.to(tl.float32) * xk.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(sq, axis=1) / N_IN + eps)
    x = _gemv_x(X, NW, m, mrow, k, kin, x_stride, rstd, dt, NORM)
    acc = tl.zeros([ROWS, BLOCK_N, BLOCK_K], tl.float32) + x[:, None, :] * w.to(tl.float32)[None]
    acc_up = tl.zeros([ROWS, BLOCK_N, BLOCK_K], tl.float32)
    if GLU:
        acc_up += x[:, None, :] * wu.to(tl.float32)[None, :, :]
    for k0 in range(BLOCK_K, N_IN, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        kin = k < N_IN
        x = _gemv_x(X, NW, m, mrow, k, kin, x_stride, rstd, dt, NORM)
        wmask = live[:, None] & kin[None, :]
        wk = tl.load(W + n[:, None] * N_IN + k[None, :], mask=wmask, other=0.0).to(tl.float32)
        acc += x[:, None, :] * wk[None, :, :]
        if GLU:
            wuk = tl.load(W + (n + n_out)[:, None] * N_IN + k[None, :], mask=wmask, other=0.0)
            acc_up += x[:, None, :] * wuk.to(tl.float32)[None, :, :]
    y = tl.sum(acc, axis=2)  # [ROWS, BLOCK_N]
    if HAS_BIAS:
        y += tl.load(BIAS + n, mask=live, other=0.0).to(tl.float32)[None, :]
    y = y.to(dt).to(tl.float32)
    if GLU:
        up = tl.sum(acc_up, axis=2)
        if HAS_BIAS:
            up += tl.load(BIAS + n_out + n, mask=live, other=0.0).to(tl.float32)[None, :]
        act = (y / (1.0 + tl.exp(-y))).to(dt).to(tl.float32)
        y = act * up.to(dt).to(tl.float32)
    offs = m[:, None] * n_out + n[None, :]
    omask = mrow & live[None, :]
    if HAS_RES:
        y = tl.load(RES + offs, mask=omask, other=0.0).to(tl.float32) + y
    tl.store(Y + offs, y.to(dt), mask=omask)


class GemvLaunch(NamedTuple):
    """How `gemv` launches: ``wide`` output rows per program where that still gives at least
    ``programs`` programs, else ``narrow``; key tiles of at most ``max_block_k``, bounded so the
    fp32 accumulator [rows, block_n, block_k] holds at most ``acc`` values (64 registers per thread
    at 4 warps); ``warps`` warps. The default: 4 output rows per program (16 for an lm_head of
    128k+ rows: 1.016x), a one-row step's whole key range in one tile (read before
    `after_previous`), 8 warps: the best that tools/bench/gemv_configs.py ran through the engine
    at batch 1 on H100s (docs/benchmarks.md)."""

    wide: int = 16
    narrow: int = 4
    programs: int = 8192
    max_block_k: int = 4096
    acc: int = 16384
    warps: int = 8


GEMV_LAUNCH = GemvLaunch()  # read at each launch (so at graph capture): a bench may swap it


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    norm: tuple[torch.Tensor, float] | None = None,
    residual: torch.Tensor | None = None,
    glu: bool = False,
) -> torch.Tensor:
    """``F.linear`` for <= 4 rows as one kernel, fp32 accumulation: ``norm`` (weight, eps) first,
    ``glu`` (gate rows then up rows) gives ``silu(gate) * up``, ``residual`` is added after."""
    rows, n_in = x.shape
    n_out = weight.shape[0] // 2 if glu else weight.shape[0]
    y = torch.empty(rows, n_out, dtype=x.dtype, device=x.device)
    launch = GEMV_LAUNCH
    pad = triton.next_power_of_2(rows)
    block_n = launch.wide if triton.cdiv(n_out, launch.wide) >= launch.programs else launch.narrow
    block_k = min(launch.max_block_k, triton.next_power_of_2(n_in), launch.acc // (pad * block_n))
    nw, eps = norm if norm is not None else (weight, 0.0)
    _gemv_kernel[(triton.cdiv(n_out, block_n),)](
        x,
        weight,
        bias if bias is not None else weight,
        residual if residual is not None else y,
        y,
        nw,
        rows,
        n_out,
        x.stride(0),
        eps,
        N_IN=n_in,
        ROWS=pad,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        NORM=norm is not None,
        HAS_BIAS=bias is not None,
        HAS_RES=residual is not None,
        GLU=glu,
        num_warps=launch.warps,
        **pdl(),
    )
    return y


GEMM_ROWS = 64  # the Triton GEMM's one tile of rows; more rows: cuBLAS


class GemmLaunch(NamedTuple):
    """How `gemm` launches: ``wide`` output columns per program where that still gives at least
    ``programs`` programs, else ``narrow``; `gemm_partials` then splits the keys (halving while
    under ``programs``, >= 256 keys a range); key tiles of ``block_k`` (``split_block_k`` when
    split); ``stages`` (bf16); ``warps``. The default: the best on an H200 (~50 per projection)
    and an H100 (10 through the engine, docs/benchmarks.md; `gemv_configs.py --kernel gemm`)."""

    programs: int = 96
    wide: int = 64
    narrow: int = 32
    block_k: int = 128
    split_block_k: int = 64
    stages: int = 5
    warps: int = 4


GEMM_LAUNCH = GemmLaunch()  # read at each launch (so at graph capture): a bench may swap it


@triton.jit(do_not_specialize=["rows"])  # one build per BLOCK_M, not per batch bucket
def _gemm_kernel(
    X,
    W,
    B,
    Y,
    rows,
    n_out,
    n_in,
    x_stride,
    K_SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr,
    GLU: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    F32_DOT: tl.constexpr,
    PDL: tl.constexpr,
):
    after_previous(PDL)
    pn = tl.program_id(0)
    s = tl.program_id(1)  # key range [s * K_SPLIT, (s + 1) * K_SPLIT) of a split-K GEMM
    m = tl.arange(0, BLOCK_M)
    n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = (m < rows)[:, None]
    nmask = (n < n_out)[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K_SPLIT, BLOCK_K):
        k = s * K_SPLIT + k0 + tl.arange(0, BLOCK_K)
        kmask = (k < n_in)[None, :]
        x = tl.load(X + m[:, None] * x_stride + k[None, :], mask=mmask & kmask, other=0.0)
        w = tl.load(W + n[:, None] * n_in + k[None, :], mask=nmask & kmask, other=0.0)
        if F32_DOT:
            acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc)
        if GLU:  # the up rows sit n_out rows below the gate rows
            u = tl.load(W + (n + n_out)[:, None] * n_in + k[None, :], mask=nmask & kmask, other=0.0)
            if F32_DOT:
                acc_up = tl.dot(
                    x.to(tl.float32), tl.trans(u.to(tl.float32)), acc_up, input_precision="ieee"
                )
            else:
                acc_up = tl.dot(x, tl.trans(u), acc_up)
    omask = mmask & (n < n_out)[None, :]
    if SPLIT == 1:
        dt = Y.dtype.element_ty
        if HAS_BIAS:
            acc += tl.load(B + n, mask=n < n_out, other=0.0).to(tl.float32)[None, :]
            if GLU:
                acc_up += tl.load(B + n_out + n, mask=n < n_out, other=0.0).to(tl.float32)[None, :]
        y = acc.to(dt)
        if GLU:  # silu(gate) * up, rounded per op as silu_mul
            g = y.to(tl.float32)
            act = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
            y = (act * acc_up.to(dt).to(tl.float32)).to(dt)
        tl.store(Y + m[:, None] * n_out + n[None, :], y, mask=omask)
    else:
        tl.store(Y + (s * rows + m)[:, None] * n_out + n[None, :], acc, mask=omask)


def _gemm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, glu: bool, split_k: bool
) -> torch.Tensor:
    rows, n_in = x.shape
    if rows > GEMM_ROWS:
        raise ValueError(f"gemm: {rows} rows, at most {GEMM_ROWS}")
    n_out = weight.shape[0] // 2 if glu else weight.shape[0]
    launch = GEMM_LAUNCH
    block_n = launch.wide if triton.cdiv(n_out, launch.wide) >= launch.programs else launch.narrow
    split = 1
    while (
        split_k
        and triton.cdiv(n_out, block_n) * split < launch.programs
        and n_in // (2 * split) >= 256
    ):
        split *= 2
    block_k = launch.block_k if split == 1 else launch.split_block_k
    k_split = triton.cdiv(triton.cdiv(n_in, split), block_k) * block_k
    split = triton.cdiv(n_in, k_split)
    f32 = x.dtype == torch.float32
    if split == 1:
        y = torch.empty(rows, n_out, dtype=x.dtype, device=x.device)
    else:
        y = torch.empty(split, rows, n_out, dtype=torch.float32, device=x.device)
    _gemm_kernel[(triton.cdiv(n_out, block_n), split)](
        x,
        weight,
        bias if bias is not None else weight,
        y,
        rows,
        n_out,
        n_in,
        x.stride(0),
        K_SPLIT=k_split,
        BLOCK_M=max(16, triton.next_power_of_2(rows)),
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        SPLIT=split,
        GLU=glu,
        HAS_BIAS=bias is not None and split == 1,
        F32_DOT=f32 or INTERPRET,
        num_stages=3 if f32 else launch.stages,
        num_warps=launch.warps,
        **pdl(),
    )
    return y


def gemm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, glu: bool = False
) -> torch.Tensor:
    """``F.linear`` for <= `GEMM_ROWS` rows in one Triton kernel (fp32; ``glu`` as in `gemv`)."""
    return _gemm(x, weight, bias, glu, split_k=False)


def gemm_partials(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor | Partials:
    """`gemm` with its keys split across programs when the output is narrow (a few dozen
    column tiles would leave most SMs idle): then `Partials`, whose sum `add_rmsnorm` does."""
    y = _gemm(x, weight, bias, False, split_k=True)
    return y if y.dim() == 2 else Partials(y, bias)

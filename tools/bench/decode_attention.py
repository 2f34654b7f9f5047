"""Decode attention alone (triton_attention.decode_attention) at the agentic bench's shape: the
bandwidth it reaches against the device's copy bandwidth, per split of each row's keys.

One layer of the Qwen3-0.6B shape (16 query heads, 8 kv heads of 128 dims, bf16): ``--rows``
rows (64) with contexts drawn uniformly in ``--lengths`` lo,hi (500,5000: the agentic bench's
turns), the grid bounded by the engine's key bucket for the longest (cuda_graphs), over a slot
cache and over a paged one (blocks of 64 in shuffled order). Bytes: each row's keys and values
read once (what the kernel must read); time: the median of CUDA-graph replays of 20 calls
(triton.testing.do_bench_cudagraph). Variants: the engine's split rule ("auto") and fixed
splits, and with ``--configs`` other launch configurations (keys per tile, warps, stages, target
programs: ``triton_attention.DecodeLaunch``). Every variant is first checked against a float32 reference on fresh random data.

``--prefill LO,HI``: prefill attention instead (triton_attention.prefill_attention, as the
engine's flat prefill calls it): each row's last LO..HI positions are new tokens (the agentic
bench's observations: 150,350), each attending causally to its row's keys, in tiles of the
engine's launch and, with ``--prefill-configs``, of others (ROWSxKEYSxWARPSxSTAGES:
``triton_attention.PrefillLaunch``). Bytes: each row's keys and values once; also TFLOP/s.

``--tiny``: 3 rows of 1..130 keys, 4 heads of 32 dims, float32 (Triton's CPU interpreter where
there is no GPU: checks the variants, times nothing). Prints ONE JSON line last.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tools.bench.decode_bound import copy_bandwidth  # noqa: E402


def reference(
    q: torch.Tensor, k: list[torch.Tensor], v: list[torch.Tensor], scale: float
) -> torch.Tensor:
    """Row b's attention over its own keys k[b], v[b] ([Hkv, len, D]), in float32."""
    rep = q.shape[1] // k[0].shape[0]
    out = []
    for b in range(q.shape[0]):
        kb, vb = k[b].float().repeat_interleave(rep, 0), v[b].float().repeat_interleave(rep, 0)
        w = torch.softmax((q[b].float()[:, None, :] @ kb.transpose(1, 2)).squeeze(1) * scale, -1)
        out.append((w[:, None, :] @ vb).squeeze(1))
    return torch.stack(out)


def layouts(
    lengths: list[int],
    n_kv: int,
    dim: int,
    dtype: torch.dtype,
    dev: torch.device,
    block: int,
    gen: torch.Generator,
) -> dict[str, tuple]:
    """The same keys and values as a slot cache and as a paged pool (shuffled blocks):
    {name: (k_cache, v_cache, table | None)}, and each row's [Hkv, len, D] for the reference."""
    cap = max(lengths) + 1
    rows = len(lengths)
    k = torch.randn(rows, n_kv, cap, dim, generator=gen).to(dev, dtype)
    v = torch.randn(rows, n_kv, cap, dim, generator=gen).to(dev, dtype)
    width = -(-cap // block)
    order = (torch.randperm(rows * width, generator=gen) + 1).view(rows, width)
    pk = torch.zeros(rows * width + 1, n_kv, block, dim, dtype=dtype, device=dev)
    pv = torch.zeros_like(pk)
    pad = width * block - cap
    pk[order.flatten().to(dev)] = (
        torch.nn.functional.pad(k, (0, 0, 0, pad))
        .view(rows, n_kv, width, block, dim)
        .transpose(1, 2)
        .reshape(-1, n_kv, block, dim)
    )
    pv[order.flatten().to(dev)] = (
        torch.nn.functional.pad(v, (0, 0, 0, pad))
        .view(rows, n_kv, width, block, dim)
        .transpose(1, 2)
        .reshape(-1, n_kv, block, dim)
    )
    table = order.to(dev, torch.int32)
    return {"slots": (k, v, None), "paged": (pk, pv, table)}, (k, v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--lengths", default=None, help="lo,hi context lengths")
    ap.add_argument("--splits", default="auto,1,2,4,8", help="variants: auto and fixed splits")
    ap.add_argument(
        "--configs",
        default="",
        help="more variants, the split rule's: launch configurations KEYSxWARPSxSTAGES[xPROGRAMS] "
        "(e.g. 32x4x2,64x8x1,128x4x3x8192; triton_attention.DecodeLaunch)",
    )
    ap.add_argument("--prefill", default=None, help="lo,hi new tokens a row: prefill attention")
    ap.add_argument(
        "--prefill-configs",
        default="",
        help="with --prefill, more launch variants ROWSxKEYSxWARPSxSTAGES (e.g. 128x64x8x3; "
        "triton_attention.PrefillLaunch)",
    )
    args = ap.parse_args()
    gpu = torch.cuda.is_available()
    dev = torch.device("cuda" if gpu else "cpu")
    from stacx.inference import triton_attention as tk
    from stacx.inference.cuda_graphs import MIN_KV_BUCKET

    tiny = args.tiny or not gpu
    rows = args.rows or (3 if tiny else 64)
    lo, hi = map(int, (args.lengths or ("1,130" if tiny else "500,5000")).split(","))
    heads, n_kv, dim = (4, 2, 32) if tiny else (16, 8, 128)
    dtype = torch.float32 if tiny else torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(lo, hi + 1, (rows,), generator=gen).tolist()
    keys = MIN_KV_BUCKET
    while keys < max(lengths) + 1:  # the engine's key bucket (cuda_graphs.GraphedDecode)
        keys = keys * 3 // 2 if keys & (keys - 1) == 0 else keys * 4 // 3
    scale = dim**-0.5
    q = torch.randn(rows, heads, dim, generator=gen).to(dev, dtype)
    pos = torch.tensor([n - 1 for n in lengths], device=dev)
    caches, (k, v) = layouts(lengths, n_kv, dim, dtype, dev, 64 if not tiny else 16, gen)
    ref = reference(
        q,
        [k[b, :, :n] for b, n in enumerate(lengths)],
        [v[b, :, :n] for b, n in enumerate(lengths)],
        scale,
    )
    read = sum(lengths) * n_kv * dim * 2 * torch.finfo(dtype).bits // 8
    result: dict[str, object] = {
        "device": torch.cuda.get_device_name() if gpu else "cpu",
        "rows": rows,
        "lengths": [lo, hi],
        "keys_bucket": keys,
        "read_mb": round(read / 1e6, 1),
        "auto_splits": tk.attention_splits(rows, n_kv, keys),
    }
    if gpu:
        result["copy_gb_s"] = round(copy_bandwidth(dev) / 1e9, 1)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    if args.prefill:
        new = map(int, args.prefill.split(","))
        prefill(result, args.prefill_configs, new, lengths, caches, (k, v), heads, scale, tol, gen)
        print(json.dumps(result))
        return
    variants: list[tuple[str, int | None, tk.DecodeLaunch]] = [
        (name, None if name == "auto" else int(name), tk.DecodeLaunch())
        for name in args.splits.split(",")
    ]
    for spec in filter(None, args.configs.split(",")):
        variants.append((spec, None, tk.DecodeLaunch(*map(int, spec.split("x")))))
    for layout, (kc, vc, table) in caches.items():
        for name, splits, launch in variants:
            out = tk.decode_attention(q, kc, vc, pos, keys, scale, table, splits, launch)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            entry: dict[str, float] = {"rel_err": float(f"{err:.2e}")}
            if err > tol:
                raise RuntimeError(f"{layout} {name}: relative error {err:.2e} > {tol}")
            if gpu:
                import triton.testing

                def call(kc=kc, vc=vc, table=table, splits=splits, launch=launch) -> None:  # type: ignore[no-untyped-def]
                    tk.decode_attention(q, kc, vc, pos, keys, scale, table, splits, launch)

                ms = triton.testing.do_bench_cudagraph(call, rep=200, return_mode="median")
                entry |= {"us": round(ms * 1e3, 1), "gb_s": round(read / ms / 1e6, 1)}
                entry["of_copy"] = round(entry["gb_s"] / result["copy_gb_s"], 3)  # type: ignore[operator]
            result[f"{layout}_{name}"] = entry
            print(f"{layout} {name}: {entry}", file=sys.stderr)
    print(json.dumps(result))


def prefill(
    result: dict[str, object],
    configs: str,
    new: Iterator[int],
    lengths: list[int],
    caches: dict[str, tuple],
    kv: tuple[torch.Tensor, torch.Tensor],
    heads: int,
    scale: float,
    tol: float,
    gen: torch.Generator,
) -> None:
    """``--prefill``: each row's last n (drawn in lo..hi, at most its length) positions as new
    tokens, tiled as the engine tiles a flat piece, per launch variant; checked, then timed."""
    from stacx.inference import triton_attention as tk

    k, v = kv
    lo, hi = next(new), next(new)
    rows, n_kv, _, dim = k.shape
    dev, dtype = k.device, k.dtype
    counts = [
        min(n, int(c)) for n, c in zip(lengths, torch.randint(lo, hi + 1, (rows,)), strict=True)
    ]
    pos = [p for n, c in zip(lengths, counts, strict=True) for p in range(n - c, n)]
    q = torch.randn(len(pos), heads, dim, generator=gen).to(dev, dtype)
    rep = heads // n_kv
    ref = torch.empty(len(pos), heads, dim, device=dev)
    at = 0
    for b, (n, c) in enumerate(zip(lengths, counts, strict=True)):  # causal, in float32
        kb = k[b, :, :n].float().repeat_interleave(rep, 0)
        vb = v[b, :, :n].float().repeat_interleave(rep, 0)
        s = (q[at : at + c].float().transpose(0, 1) @ kb.transpose(1, 2)) * scale  # [H, c, n]
        s = s.masked_fill(
            torch.arange(n, device=dev) > torch.arange(n - c, n, device=dev)[:, None], float("-inf")
        )
        ref[at : at + c] = (torch.softmax(s, -1) @ vb).transpose(0, 1)
        at += c
    flops = sum((p + 1) for p in pos) * heads * dim * 4
    read = sum(lengths) * n_kv * dim * 2 * torch.finfo(dtype).bits // 8
    result |= {"prefill_tokens": len(pos), "new": [lo, hi], "read_mb": round(read / 1e6, 1)}
    result["gflop"] = round(flops / 1e9, 1)
    variants = {"engine": tk.PREFILL}
    for spec in filter(None, configs.split(",")):
        variants[spec] = tk.PrefillLaunch(*map(int, spec.split("x")))
    pos_t = torch.tensor(pos, device=dev)
    for layout, (kc, vc, table) in caches.items():
        for name, launch in variants.items():
            tile = tk.prefill_tile_tokens(rep, launch)
            tiles, first = [], 0
            for b, c in enumerate(counts):  # a flat piece's tiles: runs of one row's tokens
                tiles += [(b, first + s, min(tile, c - s)) for s in range(0, c, tile)]
                first += c
            tiles_t = torch.tensor(tiles, dtype=torch.int32, device=dev)
            args = (q, kc, vc, pos_t, tiles_t, scale, table, max(lengths), launch)
            out = tk.prefill_attention(*args)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            if err > tol:
                raise RuntimeError(f"prefill {layout} {name}: relative error {err:.2e} > {tol}")
            entry: dict[str, float] = {"rel_err": float(f"{err:.2e}"), "tiles": len(tiles)}
            if dev.type == "cuda":
                import triton.testing

                ms = triton.testing.do_bench_cudagraph(
                    lambda args=args: tk.prefill_attention(*args), rep=200, return_mode="median"
                )
                entry |= {"us": round(ms * 1e3, 1), "gb_s": round(read / ms / 1e6, 1)}
                entry["of_copy"] = round(entry["gb_s"] / result["copy_gb_s"], 3)  # type: ignore[operator]
                entry["tflop_s"] = round(flops / ms / 1e9, 1)
            result[f"prefill_{layout}_{name}"] = entry
            print(f"prefill {layout} {name}: {entry}", file=sys.stderr)


if __name__ == "__main__":
    main()

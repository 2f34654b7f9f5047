"""Decode through the engine with a projection kernel's launch configuration swept: the GEMV's
(``triton_kernels.GemvLaunch``, batch 1-4) or, with ``--kernel gemm``, the Triton GEMM's
(``triton_kernels.GemmLaunch``, 5-64 rows): which one a step runs fastest with, programmatic
dependent launch as the engine uses it.

At batch 1-4 the CUDA decode step is ~200 short kernels, 113 of them GEMVs that each read 4-13 MB
of weights (Qwen3-0.6B shape); at 64 rows the projections are ~110 Triton GEMMs; so their block
sizes, stages and warps decide how close the step gets to the bandwidth bound. For each
configuration the script builds a `TorchEngine` (paged cache, CUDA graphs captured with that
configuration), generates ``--new`` greedy tokens from a ``--prompt`` token prompt once to warm
up, then times ``--repeats`` runs (the best is reported, with the bound of
``tools/bench/engine.py``: weights plus the rows' keys and values per step). The first
configuration is the default (the baseline, same run); every other one is also checked to give
the default's greedy tokens (``same``: a different key tiling sums in another order, so a
differing token is possible, not an error).

    python tools/bench/gemv_configs.py                   # batch 1, the built-in grid
    python tools/bench/gemv_configs.py --batch 4 --configs 8/4/512/1024/8192/4,2/2/1/4096/8192/4
    python tools/bench/gemv_configs.py --kernel gemm     # batch 64, the GEMM's grid

A configuration is ``wide/narrow/programs/max_block_k/acc/warps`` (GemvLaunch's fields) or
``programs/wide/narrow/block_k/split_block_k/stages/warps`` (GemmLaunch's). Needs a CUDA device
(the engine runs these kernels on CUDA only). Prints ONE JSON line last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tools.bench.decode_bound import Bound, reply_kv_tokens  # noqa: E402
from tools.bench.engine import build_model, stacx_generate, sync  # noqa: E402

MODEL = "qwen3-0.6b-shape"

GRID = [  # the default first, the earlier defaults; then wider/narrower tiles, more warps
    "16/4/8192/4096/16384/8",
    "4/4/1/4096/16384/8",
    "8/4/512/1024/8192/4",
    "2/2/1/4096/8192/4",
    "8/4/512/1024/16384/8",
    "8/8/1/1024/8192/4",
    "8/4/512/2048/16384/8",
    "4/4/1/1024/8192/4",
    "16/16/1/512/8192/4",
    "2/2/1/4096/16384/8",
]


GEMM_GRID = [  # the default first; then narrower tiles, more key splits, fewer stages, 8 warps
    "96/64/32/128/64/5/4",
    "96/64/16/128/64/5/4",
    "264/64/16/128/64/5/4",
    "264/64/16/64/64/4/4",
    "264/64/32/128/64/5/4",
    "96/64/16/128/64/3/4",
    "96/64/32/128/64/3/4",
    "96/64/32/128/64/5/8",
]


def parse(spec: str, kernel: str) -> object:
    from stacx.inference.triton_kernels import GemmLaunch, GemvLaunch

    kind = GemvLaunch if kernel == "gemv" else GemmLaunch
    fields = spec.split("/")
    if len(fields) != len(kind._fields):
        raise SystemExit(
            f"--configs: {spec!r} is not {'/'.join(kind._fields)} "
            f"({len(kind._fields)} integers for --kernel {kernel})"
        )
    return kind(*(int(f) for f in fields))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--kernel",
        choices=("gemv", "gemm"),
        default="gemv",
        help="which launch to sweep: the GEMV's (GemvLaunch, batch 1-4) or the Triton "
        "GEMM's (GemmLaunch, batch 5-64)",
    )
    ap.add_argument("--batch", type=int, default=None, help="rows (default 1 gemv, 64 gemm)")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--configs", default=None, help="comma-separated configurations")
    args = ap.parse_args()
    args.batch = args.batch or (1 if args.kernel == "gemv" else 64)
    grid = args.configs or ",".join(GRID if args.kernel == "gemv" else GEMM_GRID)
    launches = [parse(c, args.kernel) for c in grid.split(",")]
    attr = "GEMV_LAUNCH" if args.kernel == "gemv" else "GEMM_LAUNCH"
    result: dict[str, object] = {"kernel": args.kernel, "batch": args.batch, "model": MODEL}
    if not torch.cuda.is_available():
        result["error"] = "needs a CUDA device: the engine runs its Triton kernels on CUDA only"
        print(json.dumps(result))
        return

    from stacx.inference import triton_kernels
    from stacx.inference.torch_engine import TorchEngine
    from stacx.ports import SamplingParams

    device = torch.device("cuda")
    model = build_model(MODEL, device, torch.bfloat16)
    bound = Bound(model, torch.bfloat16, device)
    result.update(bound.describe())
    result["pdl"] = triton_kernels.pdl()["PDL"]
    gen = torch.Generator().manual_seed(0)
    vocab = int(model.config.vocab_size)  # type: ignore[union-attr]
    ids = torch.randint(100, vocab - 100, (args.batch, args.prompt), generator=gen).tolist()
    greedy = SamplingParams(max_new_tokens=64, temperature=0.0, ignore_eos=True)
    rows: dict[str, dict[str, object]] = {}
    reference = None
    default = getattr(triton_kernels, attr)
    try:
        for launch in launches:
            name = "/".join(str(v) for v in launch)  # type: ignore[attr-defined]
            setattr(triton_kernels, attr, launch)
            engine = TorchEngine(
                model,
                device="cuda",
                dtype=torch.bfloat16,
                max_batch=args.batch,
                max_len=args.prompt + args.new + 8,
                kv_cache="paged",
            )
            try:
                stacx_generate(engine, ids, args.new)  # captures this configuration's graphs
                rates = []
                for _ in range(args.repeats):
                    sync(device)
                    t0 = time.perf_counter()
                    n = stacx_generate(engine, ids, args.new)
                    sync(device)
                    rates.append(n / (time.perf_counter() - t0))
                tokens = [g.output_ids for g in asyncio.run(engine.generate(ids, greedy))]
            finally:
                asyncio.run(engine.close())
            reference = reference or tokens
            steps = args.new - 1  # the first token comes from the prefill
            of = bound.of(
                args.batch * args.new,
                max(rates),
                steps,
                args.batch * reply_kv_tokens(args.prompt, args.new),
            )
            rows[name] = {
                "tok_s": round(max(rates), 1),
                "runs": [round(r, 1) for r in rates],
                "fraction_of_bound": of["fraction_of_bound"],
                "same": tokens == reference,
            }
            print(name, rows[name], file=sys.stderr, flush=True)
            torch.cuda.empty_cache()
    finally:
        setattr(triton_kernels, attr, default)
    result["configs"] = rows
    base = rows[next(iter(rows))]["tok_s"]
    best = max(rows, key=lambda k: rows[k]["tok_s"])  # type: ignore[arg-type,return-value]
    result.update(
        default=next(iter(rows)),
        best=best,
        best_over_default=round(float(rows[best]["tok_s"]) / float(base), 3),  # type: ignore[arg-type]
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()

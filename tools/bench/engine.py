"""Engine benchmark: transformers ``generate`` vs the STACX in-process engine, tokens/s.

In one run, on one device, with the same model object and the same prompts:
  1. baseline: ``model.generate`` (greedy, default dynamic cache) on a [B, prompt] batch;
  2. STACX: ``TorchEngine.generate`` on the same B prompts (continuous batching; on CUDA a
     static KV cache and CUDA-graph decode steps).
Generation length is fixed (EOS ignored); tokens/s = B * new_tokens / wall time, prefill
included for both (STACX's prefix cache is flushed before each call). Each side gets one
untimed warm-up run first (STACX's at full length, so that graph captures and compiles are not
timed).

Defaults: on CUDA, a Qwen3-0.6B-shaped model (random init, bf16; config in DESIGN.md), prompt
256, 256 new tokens, batch 1 and 64. ``--model default --device cpu`` measures SmolLM2-135M
on CPU with smaller sizes (prompt 128, 64 new tokens, batch 1 and 16).

Each batch's STACX run also gets its memory-bandwidth bound (tools/bench/decode_bound.py:
the weights once per decode step plus every row's keys at its length, over the copy bandwidth
measured in this run): ``bound_tok_s_bN`` and ``fraction_of_bound_bN``.

Prints the machine and versions, then ONE JSON line last:
{hf_tok_s_b1, stacx_tok_s_b1, hf_tok_s_bN, stacx_tok_s_bN, ratio_b1, ratio_bN, ...}.
Fails soft: a side that cannot run (e.g. a transformers API change) is reported as null with
the reason in "errors", and the script still prints its JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tools.bench.decode_bound import Bound, reply_kv_tokens  # noqa: E402

QWEN3_SHAPE = dict(
    hidden_size=1024,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=3072,
    vocab_size=151936,
    tie_word_embeddings=True,
)


def build_model(spec: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    import transformers

    if spec == "qwen3-0.6b-shape":
        cfg = transformers.Qwen3Config(**QWEN3_SHAPE, max_position_embeddings=4096)
        torch.manual_seed(0)
        with torch.device(device):
            model = transformers.Qwen3ForCausalLM(cfg)
        return model.to(dtype).eval()
    from stacx.hf import dtype_kwarg, resolve_model

    path = resolve_model(spec)
    return (
        transformers.AutoModelForCausalLM.from_pretrained(path, **dtype_kwarg(dtype))
        .to(device)
        .eval()
    )


def triton_pdl() -> bool:
    """Whether the Triton decode kernels launch under programmatic dependent launch here
    (sm90+; ``STACX_PDL=0`` turns it off for an A/B)."""
    from stacx.inference import triton_kernels

    return triton_kernels.pdl()["PDL"]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def hf_generate(
    model: torch.nn.Module,
    prompts: torch.Tensor,
    new: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
) -> int:
    """transformers generate of exactly `new` tokens, greedy or sampled (no top-k); returns
    tokens generated."""
    from transformers import GenerationConfig

    sampled = dict(temperature=temperature, top_p=top_p, top_k=0) if temperature > 0 else {}
    cfg = GenerationConfig(
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=temperature > 0,
        pad_token_id=0,
        eos_token_id=None,
        **sampled,
    )
    with torch.inference_mode():
        out = model.generate(  # type: ignore[operator]
            input_ids=prompts, attention_mask=torch.ones_like(prompts), generation_config=cfg
        )
    produced = out.shape[1] - prompts.shape[1]
    if produced != new:
        raise RuntimeError(f"generate produced {produced} tokens, expected {new}")
    return int(out.shape[0] * produced)


def stacx_generate(
    engine: object, prompts: list[list[int]], new: int, temperature: float = 0.0, top_p: float = 1.0
) -> int:
    """`new` tokens per prompt (greedy, or sampled at `temperature` and `top_p`, seeded); the
    engine's prefix cache is flushed first, so every
    call prefills its prompts in full, as HF generate does (and every call has the shapes of
    the warm-up: no plan or kernel of the prefix-reuse path is first built inside a timed run)."""
    from stacx.ports import SamplingParams

    params = SamplingParams(
        max_new_tokens=new, temperature=temperature, top_p=top_p, seed=0, ignore_eos=True
    )

    async def go() -> list:  # type: ignore[type-arg]
        await engine.flush_cache()  # type: ignore[attr-defined]
        return await engine.generate(prompts, params)  # type: ignore[attr-defined,no-any-return]

    gens = asyncio.run(go())
    lens = {len(g.output_ids) for g in gens}
    if lens != {new}:
        raise RuntimeError(f"engine produced lengths {sorted(lens)}, expected {new}")
    return sum(len(g.output_ids) for g in gens)


def hf_tokens(
    model: torch.nn.Module, prompts: torch.Tensor, new: int
) -> tuple[list[list[int]], list[torch.Tensor]]:
    """HF greedy ``generate``'s tokens per row, and its logits per step ([rows, vocab], float)."""
    from transformers import GenerationConfig

    cfg = GenerationConfig(
        max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0, eos_token_id=None
    )
    with torch.inference_mode():
        out = model.generate(  # type: ignore[operator]
            input_ids=prompts,
            attention_mask=torch.ones_like(prompts),
            generation_config=cfg,
            output_logits=True,
            return_dict_in_generate=True,
        )
    tokens = [row[prompts.shape[1] :].tolist() for row in out.sequences]
    return tokens, [step.float().cpu() for step in out.logits]


TIE_ULPS = 4  # a near tie: HF's two candidates within 4 bf16 ulps of the larger logit


def compare_greedy(
    got: list[list[int]], ref: list[list[int]], logits: list[torch.Tensor]
) -> dict[str, object]:
    """STACX's greedy rows against HF's: equal rows, and for each other row its first differing
    step and HF's logit margin there between its token and STACX's. A difference at a near tie
    (margin <= `TIE_ULPS` bf16 ulps of the logit: the reduction order decides it, as on random
    weights) is not a disagreement; any other is."""
    rows = []
    for r, (a, b) in enumerate(zip(got, ref, strict=True)):
        at = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
        if at is None:
            continue
        step = logits[at][r]
        margin = float(step[b[at]] - step[a[at]])
        ulp = 2.0**-7 * max(1.0, abs(float(step[b[at]])))  # bf16: 8 significant bits
        rows.append(
            {"row": r, "step": at, "margin": round(margin, 5), "tie": margin <= TIE_ULPS * ulp}
        )
    return {
        "rows": len(ref),
        "equal": len(ref) - len(rows),
        "differ": rows,
        "greedy_equals_hf": all(d["tie"] for d in rows),
    }


@torch.inference_mode()  # the graphs' input buffers are inference tensors
def profile_decode(engine: object, b: int, end: int) -> dict[str, object]:
    """Replay the decode graphs the timed run used for batch `b` (CUDA events, no host in the
    loop) and torch-profile one replay of the longest: GPU ms per decode step, kernels per
    step, summed kernel ms per step (the difference is the gaps between kernels) and the top
    kernels."""
    from torch.profiler import ProfilerActivity, profile

    graphed = engine._graphed  # type: ignore[attr-defined]
    rows = min(s for s in (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256) if s >= b)
    mine = [(k, g) for k, (g, _) in graphed.greedy.items() if k[0] == rows]
    steps_of = {k: k[2] for k, _ in mine}
    mine += [((*k, 1), g) for k, (g, _) in graphed.graphs.items() if k[0] == rows]
    steps_of.update({(*k, 1): 1 for k in graphed.graphs if k[0] == rows})
    if not mine:
        return {}
    key, graph = max(mine, key=lambda kg: (kg[0][2], kg[0][1]))  # most steps, longest keys
    steps = key[2]
    # real rows whose steps end where the timed run's did, `end` (the inputs it left behind
    # may be padded rows at the scratch cell, which the kernel step's attention skips)
    pos0 = end - steps
    graphed._load_inputs([1] * b, [pos0] * b, b, rows)
    graph.replay()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        graph.replay()
    stop.record()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    top = sorted(events, key=lambda e: -e.self_device_time_total)[:8]
    out: dict[str, object] = {
        "graph": list(key),
        "first_pos": pos0,
        "gpu_ms_per_step": round(start.elapsed_time(stop) / 10 / steps, 3),
        "kernel_ms_per_step": round(sum(e.self_device_time_total for e in events) / 1e3 / steps, 3),
        "kernels_per_step": round(sum(e.count for e in events) / steps, 1),
    }
    print(f"profile b={b}: {out}", file=sys.stderr)
    for e in top:
        print(
            f"  {e.self_device_time_total / 1e3 / steps:8.3f} ms/step {e.count // steps:4d}x  "
            f"{e.key[:80]}",
            file=sys.stderr,
        )
    return out


def profile_run(engine: object, ids: list[list[int]], new: int, sampling: tuple) -> dict:  # type: ignore[type-arg]
    """Torch-profile one whole STACX generate (prefill, every replay, the host between them) as
    a timeline: wall ms, GPU busy ms (the union of kernel and copy intervals), the idle time in
    gaps over 20 us, and each kernel kind's share of the busy time (a kernel counted from the
    previous one's end, so programmatic-dependent-launch overlap is not counted twice)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:  # no CPU ops: no host overhead
        t0 = time.perf_counter()
        stacx_generate(engine, ids, new, *sampling)
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - t0) * 1e3
    spans = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in prof.events()
        if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start
    )
    if not spans:
        return {}
    busy = 0.0
    kinds: dict[str, float] = {}
    gaps: list[float] = []  # idle stretches over 20 us
    where: list[tuple[float, str, str]] = []  # each gap with the kernels either side of it
    end, last = spans[0][0], ""
    for start, stop, name in spans:
        if start - end > 20:
            gaps.append(start - end)
            where.append((start - end, last[:40], name[:40]))
        last = name if stop >= end else last
        own = max(0.0, stop - max(start, end))
        busy += own
        kind = name.split("<")[0].split("(")[0][:48]
        kinds[kind] = kinds.get(kind, 0.0) + own
        end = max(end, stop)
    span_ms = (end - spans[0][0]) / 1e3
    top = sorted(kinds.items(), key=lambda kv: -kv[1])[:10]
    out = {
        "wall_ms": round(wall_ms, 1),
        "gpu_span_ms": round(span_ms, 1),
        "gpu_busy_ms": round(busy / 1e3, 1),
        "busy_of_span": round(busy / 1e3 / span_ms, 3),
        "idle_gaps_over_20us": len(gaps),
        "idle_ms_in_gaps_over_20us": round(sum(gaps) / 1e3, 1),
        "largest_gap_ms": round(max(gaps, default=0.0) / 1e3, 2),
        "busy_ms_by_kind": {k: round(v / 1e3, 1) for k, v in top},
        "largest_gaps_us": [
            [round(g), before, after] for g, before, after in sorted(where, reverse=True)[:6]
        ],
    }
    print(f"timeline b={len(ids)}: {out}", file=sys.stderr)
    return out


def timed(fn, device: torch.device) -> float:  # type: ignore[no-untyped-def]
    sync(device)
    t0 = time.perf_counter()
    n = fn()
    sync(device)
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--model", default=None, help="qwen3-0.6b-shape (CUDA default) | default | PATH"
    )
    ap.add_argument("--device", default="auto")
    ap.add_argument("--prompt-len", type=int, default=None)
    ap.add_argument("--new-tokens", type=int, default=None)
    ap.add_argument("--batches", default=None, help="comma-separated, e.g. 1,64")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    ap.add_argument("--skip-hf", action="store_true", help="only measure STACX")
    ap.add_argument(
        "--decode-steps",
        type=int,
        default=None,
        help="greedy decode steps per CUDA-graph replay (default: the engine's)",
    )
    ap.add_argument(
        "--compile-mode",
        default=None,
        help="torch.compile mode of the CUDA decode step, e.g. max-autotune-no-cudagraphs",
    )
    ap.add_argument(
        "--gemv-rows",
        type=int,
        default=None,
        help="CUDA decode steps of at most this many rows use reduction GEMVs "
        "(default: the engine's; 0: off)",
    )
    ap.add_argument(
        "--gemm-rows",
        type=int,
        default=None,
        help="kernel step: Triton GEMMs up to this many rows, cuBLAS beyond (0: cuBLAS)",
    )
    ap.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sample at this temperature on both sides (0: greedy, the default)",
    )
    ap.add_argument("--top-p", type=float, default=1.0, help="with --temperature: nucleus sampling")
    ap.add_argument(
        "--kernels",
        choices=("on", "off"),
        default=None,
        help="CUDA decode steps above --gemv-rows rows as Triton kernels (default: the "
        "engine's: on where the model allows)",
    )
    ap.add_argument(
        "--no-fuse",
        action="store_true",
        help="separate q/k/v and gate/up GEMMs (the engine fuses them by default)",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="CUDA: torch-profile one STACX generate per batch as a timeline (GPU busy vs idle, "
        "busy time by kernel kind) and one replay of its longest decode graph",
    )
    ap.add_argument(
        "--check-hf",
        action="store_true",
        help="compare STACX greedy tokens with HF generate's (first 32 tokens, batch 4): "
        "greedy_equals_hf fails only on a difference that is not a near tie of HF's logits",
    )
    ap.add_argument(
        "--kv-cache",
        choices=("slots", "paged"),
        default="slots",
        help="the engine's KV cache: one row per request (default) or a paged pool",
    )
    ap.add_argument(
        "--kv-tokens",
        type=int,
        default=None,
        help="paged: the pool's positions (default: as many as the slots would hold)",
    )
    ap.add_argument("--kv-block", type=int, default=64, help="paged: positions per block")
    args = ap.parse_args()

    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else ("cpu" if args.device == "auto" else args.device)
    )
    gpu = device.type == "cuda"
    spec = args.model or ("qwen3-0.6b-shape" if gpu else "default")
    prompt_len = args.prompt_len or (256 if gpu else 128)
    new = args.new_tokens or (256 if gpu else 64)
    batches = [int(b) for b in (args.batches or ("1,64" if gpu else "1,16")).split(",")]
    dtype = torch.bfloat16 if gpu else torch.float32
    # both sides run with the same thread count: the engine's default rule (1 on <= 2 cores)
    threads = args.threads or (1 if not gpu and (os.cpu_count() or 1) <= 2 else None)
    if threads:
        torch.set_num_threads(threads)

    import transformers

    print(
        f"machine: {platform.node()} {platform.machine()} cpus={os.cpu_count()} "
        f"threads={torch.get_num_threads()}",
        file=sys.stderr,
    )
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, device {device}"
        + (f" ({torch.cuda.get_device_name(device)})" if gpu else ""),
        file=sys.stderr,
    )
    print(
        f"model {spec}, {dtype}, prompt {prompt_len}, new {new}, batches {batches}", file=sys.stderr
    )

    sampling = (args.temperature, args.top_p)
    result: dict[str, object] = {
        "model": spec,
        "device": str(device),
        "prompt_len": prompt_len,
        "new_tokens": new,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "errors": {},
    }
    errors: dict[str, str] = result["errors"]  # type: ignore[assignment]
    try:
        model = build_model(spec, device, dtype)
    except Exception as e:
        errors["model"] = f"{type(e).__name__}: {e}"
        print(json.dumps(result))
        return
    bound = Bound(model, dtype, device)  # before the engine takes its cache: the copy's buffers
    result.update(bound.describe())
    vocab = int(model.config.vocab_size)  # type: ignore[union-attr]
    gen = torch.Generator().manual_seed(0)
    all_prompts = torch.randint(100, vocab - 100, (max(batches), prompt_len), generator=gen)

    for b in batches:
        prompts = all_prompts[:b].to(device)
        if not args.skip_hf:
            try:
                hf_generate(model, prompts, 4)  # warm-up
                rate = timed(lambda p=prompts: hf_generate(model, p, new, *sampling), device)
                result[f"hf_tok_s_b{b}"] = round(rate, 1)
                print(f"hf    b={b}: {rate:.1f} tok/s", file=sys.stderr)
            except Exception as e:
                errors[f"hf_b{b}"] = f"{type(e).__name__}: {e}"
                traceback.print_exc()
                result[f"hf_tok_s_b{b}"] = None
        if gpu:
            torch.cuda.empty_cache()

    try:
        from stacx.inference.torch_engine import TorchEngine
        from stacx.ports import SamplingParams

        kernels = None if args.kernels is None else args.kernels == "on"
        tuning = {
            k: v
            for k, v in (
                ("decode_steps", args.decode_steps),
                ("kernels", kernels),
                ("gemv_rows", args.gemv_rows),
            )
            if v is not None
        }
        engine = TorchEngine(
            model,
            device=str(device),
            dtype=dtype,
            max_batch=max(batches),
            threads=threads,
            max_len=prompt_len + new + 8,
            compile_mode=args.compile_mode,
            fuse=not args.no_fuse,
            kv_cache=args.kv_cache,
            kv_tokens=args.kv_tokens,
            kv_block=args.kv_block,
            **tuning,
        )
        if args.gemm_rows is not None:  # before the warm-up captures the graphs
            engine.decoder.gemm_rows = args.gemm_rows
        result.update(
            decode_steps=engine.decode_steps,
            compile_mode=args.compile_mode,
            gemm_rows=engine.decoder.gemm_rows,
            gemv_rows=engine.decoder.gemv_rows,
            fused=not args.no_fuse,
            kernels=engine.decoder.kernels,
            pdl=gpu and triton_pdl(),
            kv_cache=args.kv_cache,
            kv_gib=round(engine.kv_usage()["bytes"] / 2**30, 3),
        )
        for b in batches:
            ids = all_prompts[:b].tolist()
            try:
                # warm-up at full length: captures every CUDA graph the timed run replays (one per
                # batch x key-length bucket x steps per replay), as a long-running engine has
                stacx_generate(engine, ids, new, *sampling)
                before = dict(engine.stats)
                rate = timed(lambda i=ids: stacx_generate(engine, i, new, *sampling), device)
                result[f"stacx_tok_s_b{b}"] = round(rate, 1)
                calls = engine.stats["decode_calls"] - before["decode_calls"]
                steps = engine.stats["decode_steps"] - before["decode_steps"]
                result[f"stacx_steps_per_call_b{b}"] = round(steps / max(calls, 1), 2)
                of = bound.of(b * new, rate, steps, b * reply_kv_tokens(prompt_len, new))
                result[f"bound_tok_s_b{b}"] = of["bound_tok_s"]
                result[f"fraction_of_bound_b{b}"] = of["fraction_of_bound"]
                sync(device)
                t0 = time.perf_counter()
                stacx_generate(engine, ids, 1)  # the prefill and its first token
                sync(device)
                result[f"stacx_prefill_ms_b{b}"] = round((time.perf_counter() - t0) * 1e3, 1)
                print(
                    f"stacx b={b}: {rate:.1f} tok/s (prefill + first token "
                    f"{result[f'stacx_prefill_ms_b{b}']} ms)",
                    file=sys.stderr,
                )
            except Exception as e:
                errors[f"stacx_b{b}"] = f"{type(e).__name__}: {e}"
                traceback.print_exc()
                result[f"stacx_tok_s_b{b}"] = None
                continue
            if args.profile and gpu:  # a failed profile keeps the rate measured above
                try:
                    result[f"timeline_b{b}"] = profile_run(engine, ids, new, sampling)
                    result[f"profile_b{b}"] = profile_decode(engine, b, prompt_len + new)
                except Exception as e:
                    errors[f"profile_b{b}"] = f"{type(e).__name__}: {e}"
                    traceback.print_exc()
        graphed = getattr(engine, "_graphed", None)
        if graphed is not None:
            compiled = engine.decoder.compiled
            print(f"cuda graphs {sorted(graphed.graphs)}, compiled={compiled}", file=sys.stderr)
            result["stacx_compiled"] = compiled
        if args.check_hf:
            ids = all_prompts[:4].tolist()
            check_new = min(32, new)  # the engine's rows hold prompt_len + new tokens
            ref, logits = hf_tokens(model, all_prompts[:4].to(device), check_new)
            got = [
                g.output_ids
                for g in asyncio.run(
                    engine.generate(
                        ids,
                        SamplingParams(max_new_tokens=check_new, temperature=0.0, ignore_eos=True),
                    )
                )
            ]
            check = compare_greedy(got, ref, logits)
            result["greedy_equals_hf"] = check.pop("greedy_equals_hf")
            result["check_hf"] = check
            print(f"greedy vs HF generate: {check}", file=sys.stderr)
        asyncio.run(engine.close())
    except Exception as e:
        errors["stacx"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()

    for b in batches:
        hf, sx = result.get(f"hf_tok_s_b{b}"), result.get(f"stacx_tok_s_b{b}")
        ok = isinstance(hf, float) and isinstance(sx, float) and hf > 0
        result[f"ratio_b{b}"] = round(sx / hf, 2) if ok else None  # type: ignore[operator]
    print(json.dumps(result))


if __name__ == "__main__":
    main()

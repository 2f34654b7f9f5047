"""Agentic engine benchmark: many multi-turn episodes through one engine, as agents drive it.

The workload (seeded, so runs repeat): N episodes (default 64) x T turns (default 10). Episode
e starts from a random prompt (``--start`` ids); turn t appends an observation of random ids
(``--obs`` lo,hi: drawn uniformly per episode and turn) to the previous prompt + the previous
reply and generates a reply of a fixed length (``ignore_eos``) drawn per episode and turn from
a long-tailed distribution on ``--reply`` lo,hi (lo + an exponential of mean (hi-lo)/4,
clipped at hi). Replies are greedy; only their lengths are fixed by the workload, so every
side below runs the same number of prompt and generated tokens.

Sides, in one run, on one device, on the same model object:
  1. STACX cold: a fresh ``TorchEngine`` as ``stacx run`` opens it (graphed: after its
     ``warm_up``, whose seconds are ``warmup_s``), each episode an asyncio task that submits its
     next turn (``generate_stream``) as soon as its previous one returns, as agents do;
  2. STACX warm: the same workload again on the same engine (every graph it met captured);
     ``cold_over_warm_time`` compares the two, ``warmup_and_cold_over_warm_time`` counts the
     warm-up in;
  3. STACX with prefix reuse off: as 2, with the prefix cache flushed (``flush_cache``) before
     every turn, so every turn prefills its whole context;
  4. ``--together``: as 2, with all episodes' turn t submitted at once (a barrier per turn);
  5. HF ``generate`` (default dynamic cache), every turn re-prefilling the whole context, the
     first ``--hf-episodes`` episodes' turn t as one left-padded batch (generating the turn's
     longest reply for every row; only the requested tokens count), over the first
     ``--hf-turns`` turns (skipped with ``--skip-hf``);
  6. on CUDA, the same through transformers' static-cache path (``cache_implementation=
     "static"``, its compiled decode step; one cache sized for the whole workload), after an
     untimed first turn that compiles it.
The prefix cache is flushed before each STACX pass, and starts are distinct random ids, so a
first turn reuses nothing; ``reuse_rate_after_first`` = reused / submitted prompt tokens of
turns 2..T (``reuse_ideal_after_first``: what reusing every previous prompt + reply would give).
Prefill counts are the engine's ``stats["prefill_tokens"]`` / ``["reused_tokens"]``. Time to
first token: submission to the first streamed id, per turn (the engine streams the first token
right after the prefill that makes it). KV memory: the cache's allocated bytes
(``kv_cache_gib``; slots on CUDA: max_batch x max_len at full size) and per pass the positions
running rows held at the peak (``kv_peak_tokens`` / ``kv_peak_gib``: paged, their blocks, cached
prefixes not counted; slots, the whole cache); on CUDA also the peak
``torch.cuda.max_memory_allocated``. ``--kv-cache paged`` runs the engine on its paged cache
(``--kv-tokens``: the pool; ``--kv-block``: positions per block); ``preempted`` counts rows
recomputed because the pool was full. ``--group N`` adds a pass where every turn is N sampled
replies to its prompt in one call (a GRPO group; the episode goes on with the first):
``reuse_ideal`` then counts the other samples reusing the prompt but its last token. Its bound
counts every row's keys, as for the other passes; over a paged cache, whose group rows share
their prompt's blocks, ``fraction_of_unique_bound`` also counts a shared prompt's keys once a
step (what a step must read at least).

The memory-bandwidth bound (tools/bench/decode_bound.py): the device's copy bandwidth is
measured in the run (``copy_gb_s``); every STACX pass reports the bytes its decode had to read
(``decode_read_gb``: the weights once per decode step, plus each reply's steps reading its
context, ``decode_kv_tokens``), ``bound_tok_s`` (its tokens over that read at the copy
bandwidth) and ``fraction_of_bound`` (tok_s over it), ``prefill_s`` (the engine's time in
admission rounds: prefills and their first tokens) and ``fraction_of_bound_outside_prefill``
(the bound's time over the pass's time outside them), and ``ttft_ms_p50_after_first`` (turns
2..T). What a pass paid to meet new shapes: ``graph_captures`` and ``capture_s`` (CUDA graphs
captured during it, with the Triton builds their first launches ran) and ``triton_builds`` (the
builds each kernel gained in it: a cold pass after a complete warm-up shows none). ``--profile [TRACE]``: one more warm pass, torch-profiled over the middle fifth of its
time: kernel (CPU: op) ms per decode step by kind (attention, gemm, sampling, other, host gaps)
under "profile", the chrome trace at TRACE.

Admission (stacx/inference/engine_admission.py): ``--hold`` seconds a finished turn's row is
held for that episode's next turn (0: first come, first served), ``--prefill-tokens`` new
tokens per admission round; ``--group-fifo`` runs the group pass again with ``--hold 0``
(``stacx_group_fifo``: the TTFT of next turns without holds, in the same run).

``--tiny``: SmolLM2-135M on CPU, 4 episodes x 3 turns, start 64, observations 64, replies
16-32 (about a minute on a 2-core machine). Default on CUDA: the Qwen3-0.6B shape (random init,
bf16); ``--shape 4b|8b`` the Qwen3-4B/8B shapes.

Prints the machine and versions to stderr, then ONE JSON line last. Fails soft: a side that
cannot run is null with the reason in "errors".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from stacx.inference.decoder_kernels import triton_builds  # noqa: E402
from tools.bench.decode_bound import Bound, Window, reply_kv_tokens  # noqa: E402
from tools.bench.engine import QWEN3_SHAPE, build_model, sync, triton_pdl  # noqa: E402

SHAPES = {
    "0.6b": QWEN3_SHAPE,
    "4b": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
               head_dim=128, intermediate_size=9728, vocab_size=151936, tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
               head_dim=128, intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False),
}  # fmt: skip


@dataclass
class Workload:
    starts: list[list[int]]  # per episode
    obs: list[list[list[int]]]  # per episode, per turn
    replies: list[list[int]]  # reply length per episode, per turn

    @property
    def turns(self) -> int:
        return len(self.obs[0])

    def max_context(self) -> int:
        return max(
            len(s) + sum(map(len, o)) + sum(r)
            for s, o, r in zip(self.starts, self.obs, self.replies, strict=True)
        )

    def prompt_tokens(self, episodes: int, turns: int) -> tuple[int, int, int]:
        """(submitted prompt tokens of turn 1, of turns 2..`turns`, the reusable part of the
        latter: each previous prompt + reply, less the reply's last id, whose keys no step wrote)."""
        first = later = ideal = 0
        for e in range(episodes):
            n = len(self.starts[e])
            for t in range(turns):
                if t:
                    ideal += n - 1
                    later += n + len(self.obs[e][t])
                else:
                    first += n + len(self.obs[e][t])
                n += len(self.obs[e][t]) + self.replies[e][t]
        return first, later, ideal


def make_workload(
    episodes: int,
    turns: int,
    start: int,
    obs: tuple[int, int],
    reply: tuple[int, int],
    vocab: int,
    seed: int,
) -> Workload:
    rng, tok = random.Random(seed), random.Random(seed + 1)  # lengths do not depend on vocab

    def ids(n: int) -> list[int]:
        return [tok.randrange(100, vocab - 100) for _ in range(n)]

    lo, hi = reply
    return Workload(
        starts=[ids(start) for _ in range(episodes)],
        obs=[[ids(rng.randint(*obs)) for _ in range(turns)] for _ in range(episodes)],
        replies=[
            [lo + min(hi - lo, int(rng.expovariate(4 / max(hi - lo, 1)))) for _ in range(turns)]
            for _ in range(episodes)
        ],
    )


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(q * len(s)))], 1)


async def stacx_pass(
    engine: object,
    wl: Workload,
    *,
    reuse: bool,
    together: bool,
    group: int = 1,
    shared_prompt: bool = False,
) -> dict[str, object]:
    """Run the whole workload once; tokens/s, prefill counts and TTFT per turn (ms). `group`
    > 1: each turn is `group` samples of its prompt in one call (a GRPO group: temperature 1,
    seeded), the episode going on with the first. ``shared_prompt``: the samples' rows share
    their prompt's keys (a paged cache's blocks): ``decode_unique_kv_tokens`` counts them once a
    step, the least a step must read (slots: each row holds its own copy)."""
    from stacx.ports import SamplingParams

    n, turns = len(wl.starts), wl.turns
    ttft: list[list[float]] = [[] for _ in range(turns)]
    prompts = [list(s) for s in wl.starts]
    kv_tokens = 0  # keys the decode steps of every reply read (decode_bound.reply_kv_tokens)
    unique = 0  # the same, a shared prompt's keys counted once a step
    await engine.flush_cache()  # type: ignore[attr-defined]

    async def turn(e: int, t: int) -> int:
        nonlocal kv_tokens, unique
        if not reuse:
            await engine.flush_cache()  # type: ignore[attr-defined]
        prompts[e] += wl.obs[e][t]
        temp, seed = (1.0, 1000 * e + t) if group > 1 else (0.0, None)
        params = SamplingParams(
            max_new_tokens=wl.replies[e][t], temperature=temp, seed=seed, ignore_eos=True
        )
        t0, outs = time.perf_counter(), [[] for _ in range(group)]  # type: ignore[var-annotated]
        async for d in engine.generate_stream([prompts[e]] * group, params):  # type: ignore[attr-defined]
            if not any(outs) and d.output_ids:
                ttft[t].append((time.perf_counter() - t0) * 1e3)
            outs[d.index] += d.output_ids
        if any(len(out) != wl.replies[e][t] for out in outs):
            raise RuntimeError(
                f"episode {e} turn {t}: {[len(o) for o in outs]} tokens, expected {wl.replies[e][t]}"
            )
        reply = wl.replies[e][t]
        kv_tokens += group * reply_kv_tokens(len(prompts[e]), reply)
        copies = 1 if shared_prompt else group  # of the prompt's keys; each reads its own reply's
        unique += copies * reply_kv_tokens(len(prompts[e]), reply)
        unique += (group - copies) * reply_kv_tokens(0, reply)
        prompts[e] += outs[0]
        return sum(map(len, outs))

    async def episode(e: int) -> int:
        return sum([await turn(e, t) for t in range(turns)])

    before = dict(engine.stats)  # type: ignore[attr-defined]
    built = triton_builds()
    t0 = time.perf_counter()
    if together:
        made = 0
        for t in range(turns):
            made += sum(await asyncio.gather(*(turn(e, t) for e in range(n))))
    else:
        made = sum(await asyncio.gather(*(episode(e) for e in range(n))))
    wall = time.perf_counter() - t0
    stats = {k: v - before[k] for k, v in engine.stats.items()}  # type: ignore[attr-defined]
    builds = {k: n - built.get(k, 0) for k, n in triton_builds().items() if n > built.get(k, 0)}
    first, later, ideal = wl.prompt_tokens(n, turns)
    # a group's other samples reuse all of its prompt but the last token
    ideal += (group - 1) * (first + later - n * turns)
    submitted = group * (first + later)
    flat = [x for row in ttft for x in row]
    after_first = (
        {  # turn 1 reuses nothing without groups: every reused token is a later turn's
            "reuse_rate_after_first": round(stats["reused_tokens"] / max(later, 1), 4),
            "reuse_ideal_after_first": round(ideal / max(later, 1), 4),
        }
        if group == 1
        else {}
    )
    return {
        "tok_s": round(made / wall, 1),
        "wall_s": round(wall, 2),
        "generated": made,
        "submitted_prompt_tokens": submitted,
        "prefill_tokens": stats["prefill_tokens"],
        "reused_tokens": stats["reused_tokens"],
        "reuse_rate": round(stats["reused_tokens"] / submitted, 4),
        "reuse_ideal": round(ideal / submitted, 4),
        **after_first,
        "ttft_ms_p50": pct(flat, 0.5),
        "ttft_ms_p99": pct(flat, 0.99),
        "ttft_ms_p50_after_first": pct([x for row in ttft[1:] for x in row], 0.5),
        "ttft_ms_p50_per_turn": [pct(row, 0.5) for row in ttft],
        "ttft_ms_p99_per_turn": [pct(row, 0.99) for row in ttft],
        "decode_steps": stats["decode_steps"],
        "decode_kv_tokens": kv_tokens,
        **({"decode_unique_kv_tokens": unique} if unique != kv_tokens else {}),
        "admit_rounds": stats["admit_rounds"],
        "prefill_s": round(stats["admit_us"] / 1e6, 2),
        "preempted": stats["preempted"],
        "graph_captures": stats.get("graph_captures", 0),
        "capture_s": round(stats.get("capture_us", 0) / 1e6, 2),
        "triton_builds": builds,
    }


def hf_pass(
    model: torch.nn.Module,
    wl: Workload,
    episodes: int,
    turns: int,
    device: torch.device,
    static: bool,
) -> dict[str, object]:
    """Turn t of the first `episodes` episodes as one left-padded `generate` batch, the whole
    context prefilled every turn. Static: one static cache for the workload's longest context,
    the first turn run untimed first (it compiles the decode step)."""
    from transformers import GenerationConfig

    prompts = [list(s) for s in wl.starts[:episodes]]

    def run_turn(t: int, prompts: list[list[int]]) -> list[list[int]]:
        rows = [p + wl.obs[e][t] for e, p in enumerate(prompts)]
        width, new = max(map(len, rows)), max(wl.replies[e][t] for e in range(episodes))
        ids = torch.tensor([[0] * (width - len(r)) + r for r in rows], device=device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
        extra = (
            dict(cache_implementation="static", max_cache_len=wl.max_context() + 8)
            if static
            else {}
        )
        cfg = GenerationConfig(
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
            **extra,
        )
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)  # type: ignore[operator]
        return [r + out[e, width : width + wl.replies[e][t]].tolist() for e, r in enumerate(rows)]

    if static:
        run_turn(0, prompts)  # compiles
    sync(device)
    t0 = time.perf_counter()
    for t in range(turns):
        prompts = run_turn(t, prompts)
    sync(device)
    wall = time.perf_counter() - t0
    made = sum(wl.replies[e][t] for e in range(episodes) for t in range(turns))
    return {
        "tok_s": round(made / wall, 1),
        "wall_s": round(wall, 2),
        "generated": made,
        "episodes": episodes,
        "turns": turns,
    }


def load_model(
    args: argparse.Namespace, device: torch.device, dtype: torch.dtype, max_ctx: int
) -> torch.nn.Module:
    if args.model:  # engine.py's qwen3-0.6b-shape has 4096 positions: the shapes here have more
        return build_model(args.model, device, dtype)
    import transformers

    cfg = transformers.Qwen3Config(**SHAPES[args.shape], max_position_embeddings=max(max_ctx, 4096))
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.Qwen3ForCausalLM(cfg)
    return model.to(dtype).eval()


def pair(s: str) -> tuple[int, int]:
    lo, _, hi = s.partition(",")
    return int(lo), int(hi or lo)


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tiny", action="store_true", help="CPU, SmolLM2-135M, 4 episodes x 3 turns")
    ap.add_argument("--model", default=None, help="default | PATH (an HF model; overrides --shape)")
    ap.add_argument(
        "--shape", choices=sorted(SHAPES), default="0.6b", help="random-init Qwen3 shape"
    )
    ap.add_argument("--device", default="auto")
    ap.add_argument("--episodes", type=int, default=None)
    ap.add_argument("--turns", type=int, default=None)
    ap.add_argument("--start", type=int, default=None, help="first prompt's ids per episode")
    ap.add_argument("--obs", type=pair, default=None, help="observation ids per turn: lo,hi")
    ap.add_argument(
        "--reply", type=pair, default=None, help="reply tokens per turn: lo,hi (long-tailed)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-batch", type=int, default=None, help="engine slots (default: episodes)")
    ap.add_argument(
        "--together", action="store_true", help="also run all episodes' turn t as one batch"
    )
    ap.add_argument("--skip-hf", action="store_true", help="no HF baselines")
    ap.add_argument(
        "--hf-episodes", type=int, default=None, help="HF baselines: episodes (default all)"
    )
    ap.add_argument(
        "--hf-turns", type=int, default=None, help="HF baselines: turns (default 3 on CUDA)"
    )
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
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
    ap.add_argument(
        "--group",
        type=int,
        default=1,
        help="also a pass where each turn is this many samples of its prompt (a GRPO group)",
    )
    ap.add_argument(
        "--hold",
        type=float,
        default=0.5,
        help="seconds a finished turn's row waits for its next turn (0: FIFO admission)",
    )
    ap.add_argument(
        "--group-fifo",
        action="store_true",
        help="with --group: the group pass again with first-come admission (--hold 0)",
    )
    ap.add_argument(
        "--prefill-tokens",
        type=int,
        default=None,
        help="new tokens prefilled per admission round (default: the engine's)",
    )
    ap.add_argument(
        "--profile",
        nargs="?",
        const="engine_agentic_trace.json",
        default=None,
        metavar="TRACE",
        help="torch-profile the middle of one more warm pass: kernel "
        "ms per decode step by kind in the JSON line, the chrome trace to TRACE",
    )
    ap.add_argument(
        "--prefill-launch",
        default=None,
        metavar="ROWSxKEYSxWARPSxSTAGES",
        help="the prefill attention's launch for this run (triton_attention.PrefillLaunch; "
        "default: the engine's)",
    )
    args = ap.parse_args()
    if args.tiny:
        args.device = "cpu" if args.device == "auto" else args.device
        args.model = args.model or "default"
    return args


def main() -> None:
    args = parse()
    if args.prefill_launch:  # before any engine tiles a prefill
        from stacx.inference import triton_attention

        launch = triton_attention.PrefillLaunch(*map(int, args.prefill_launch.split("x")))
        triton_attention.PREFILL = launch
    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else ("cpu" if args.device == "auto" else args.device)
    )
    gpu, tiny = device.type == "cuda", args.tiny
    episodes = args.episodes or (4 if tiny else 64)
    turns = args.turns or (3 if tiny else 10)
    start = args.start or (64 if tiny else 512)
    obs = args.obs or ((64, 64) if tiny else (150, 350))
    reply = args.reply or ((16, 32) if tiny else (100, 300))
    hf_episodes = min(args.hf_episodes or episodes, episodes)
    hf_turns = min(args.hf_turns or (3 if gpu else turns), turns)
    dtype = torch.bfloat16 if gpu else torch.float32
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
    spec = args.model or f"qwen3-{args.shape}-shape"
    result: dict[str, object] = {
        "model": spec,
        "device": str(device),
        "episodes": episodes,
        "turns": turns,
        "start": start,
        "obs": list(obs),
        "reply": list(reply),
        "prefill_launch": args.prefill_launch or "engine",
        "errors": {},
    }
    errors: dict[str, str] = result["errors"]  # type: ignore[assignment]
    try:
        # the workload's longest context sizes the model's positions (random shapes) and cache
        probe = make_workload(episodes, turns, start, obs, reply, 1000, args.seed).max_context()
        model = load_model(args, device, dtype, probe + 8)
    except Exception as e:
        errors["model"] = f"{type(e).__name__}: {e}"
        print(json.dumps(result))
        return
    vocab = int(model.config.vocab_size)  # type: ignore[union-attr]
    wl = make_workload(episodes, turns, start, obs, reply, vocab, args.seed)
    result["max_context"] = wl.max_context()
    print(
        f"model {spec}, {dtype}, {episodes} episodes x {turns} turns, contexts up to "
        f"{wl.max_context()}",
        file=sys.stderr,
    )
    bound = Bound(model, dtype, device)  # before the engine takes its cache: the copy's buffers
    result.update(bound.describe())
    print(f"bound: {bound.describe()}", file=sys.stderr)
    run_stacx(args, model, wl, device, dtype, threads, result, bound)
    if not args.skip_hf:
        for name, static in (("hf", False), ("hf_static", True)):
            if static and not gpu:
                continue  # the static-cache compiled path is a CUDA baseline
            try:
                r = hf_pass(model, wl, hf_episodes, hf_turns, device, static)
                result[name] = r
                print(f"{name}: {r}", file=sys.stderr)
            except Exception as e:
                errors[name] = f"{type(e).__name__}: {e}"
                traceback.print_exc()
                result[name] = None
    warm = result.get("stacx_warm")
    if isinstance(warm, dict):
        for key in ("stacx_cold", "stacx_no_reuse", "stacx_together", "hf", "hf_static"):
            other = result.get(key)
            if isinstance(other, dict) and other["tok_s"]:
                result[f"warm_over_{key}"] = round(warm["tok_s"] / other["tok_s"], 2)
    print(json.dumps(result))


def run_stacx(
    args: argparse.Namespace,
    model: torch.nn.Module,
    wl: Workload,
    device: torch.device,
    dtype: torch.dtype,
    threads: int | None,
    result: dict[str, object],
    bound: Bound,
) -> None:
    errors: dict[str, str] = result["errors"]  # type: ignore[assignment]
    gpu = device.type == "cuda"
    try:
        from stacx.inference.torch_engine import TorchEngine

        engine = TorchEngine(
            model,
            device=str(device),
            dtype=dtype,
            threads=threads,
            max_batch=args.max_batch or len(wl.starts),
            max_len=wl.max_context() + 8,
            kv_cache=args.kv_cache,
            kv_tokens=args.kv_tokens,
            kv_block=args.kv_block,
            hold_s=args.hold,
            prefill_tokens=args.prefill_tokens,
        )
        # as `stacx run` opens it: a graphed engine builds its kernels and graphs before serving
        result["warmup_s"] = (
            round(asyncio.run(engine.warm_up()).seconds, 2) if engine.graphed else 0.0
        )
        usage = engine.kv_usage()
        result.update(
            kv_cache=args.kv_cache,
            pdl=gpu and triton_pdl(),
            kv_pool_tokens=usage["pool_tokens"],
            kv_cache_gib=round(usage["bytes"] / 2**30, 3),
        )  # allocated (CPU: grown so far)
    except Exception as e:
        errors["stacx"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
        return
    passes = [
        ("stacx_cold", True, False),
        ("stacx_warm", True, False),
        ("stacx_no_reuse", False, False),
    ]
    if args.together:
        passes.append(("stacx_together", True, True))
    if args.group > 1:
        passes.append(("stacx_group", True, False))
        if args.group_fifo:
            passes.append(("stacx_group_fifo", True, False))
    for name, reuse, together in passes:
        try:
            if gpu:
                torch.cuda.reset_peak_memory_stats(device)
            engine.reset_kv_peak()
            group = args.group if name.startswith("stacx_group") else 1
            engine._holds.hold_s = 0.0 if name.endswith("_fifo") else args.hold  # (a bench's reach)
            shared = args.kv_cache == "paged"  # a group's samples share their prompt's blocks
            r = asyncio.run(
                stacx_pass(
                    engine, wl, reuse=reuse, together=together, group=group, shared_prompt=shared
                )
            )
            usage = engine.kv_usage()
            # the KV positions running rows held at the peak (paged: their blocks; slots: the
            # whole cache) and their bytes
            r["kv_peak_tokens"] = usage["peak_tokens"]
            r["kv_peak_gib"] = round(usage["peak_tokens"] * usage["token_bytes"] / 2**30, 3)
            r.update(bound.of(r["generated"], r["tok_s"], r["decode_steps"], r["decode_kv_tokens"]))  # type: ignore[arg-type]
            if "decode_unique_kv_tokens" in r:  # rows sharing keys: the bound of unique reads
                least = bound.of(
                    r["generated"], r["tok_s"], r["decode_steps"], r["decode_unique_kv_tokens"]
                )  # type: ignore[arg-type]
                r["fraction_of_unique_bound"] = least["fraction_of_bound"]
            # the same over the time outside admission rounds (prefills): decode's own efficiency
            outside = max(r["wall_s"] - r["prefill_s"], 1e-3)  # type: ignore[operator]
            r["fraction_of_bound_outside_prefill"] = round(  # type: ignore[operator]
                r["fraction_of_bound"] * r["wall_s"] / outside, 4
            )
            if gpu:
                r["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
            result[name] = r
            print(f"{name}: {r}", file=sys.stderr)
        except Exception as e:
            errors[name] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
            result[name] = None
    cold, warm = result.get("stacx_cold"), result.get("stacx_warm")
    if isinstance(cold, dict) and isinstance(warm, dict):
        result["cold_over_warm_time"] = round(cold["wall_s"] / warm["wall_s"], 2)
        result["warmup_and_cold_over_warm_time"] = round(
            (result["warmup_s"] + cold["wall_s"]) / warm["wall_s"],
            2,  # type: ignore[operator]
        )
    if args.profile and isinstance(warm, dict):
        try:
            result["profile"] = asyncio.run(
                profile_pass(engine, wl, warm["decode_steps"], device, args.profile)
            )
            print(f"profile: {result['profile']}", file=sys.stderr)
        except Exception as e:
            errors["profile"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
    asyncio.run(engine.close())


async def profile_pass(
    engine: object, wl: Workload, warm_steps: int, device: torch.device, trace: str
) -> dict[str, object]:
    """The warm pass again, torch-profiled from 40% to 60% of the warm pass's decode steps (the
    middle of the phase, contexts half grown; the full pass would make a trace of millions of
    kernels): kernel time per decode step by kind, host gaps, and the trace at `trace`. The
    window follows the engine's steps, not the clock, so a slower or faster pass (a loaded
    machine) still puts decode steps in it."""
    stats: dict[str, int] = engine.stats  # type: ignore[attr-defined]
    window = Window(device, lambda: stats["decode_steps"])
    base, ended = stats["decode_steps"], asyncio.Event()

    async def reach(fraction: float) -> None:
        # the engine's own thread counts the steps: there is nothing to await but a poll
        while stats["decode_steps"] < base + fraction * warm_steps and not ended.is_set():  # noqa: ASYNC110
            await asyncio.sleep(0.002)

    async def timer() -> None:
        await reach(0.4)
        window.start()
        await reach(0.6)
        window.stop()

    clock = asyncio.create_task(timer())
    await stacx_pass(engine, wl, reuse=True, together=False)
    ended.set()  # a pass of fewer steps than the warm one: the window ends with it
    await clock
    return window.summary(Path(trace))


if __name__ == "__main__":
    main()

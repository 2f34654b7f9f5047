"""Trainer benchmark: a plain HF train step vs the STACX trainer step, and weight-sync latency.

In one run, on one device, on the same GRPO-shaped batches (sequence lengths uniform in
[min_len, max_len], a prompt of 1/8..1/2 of each, loss on the completion only):

  1. hf: the plain transformers step — right-padded micro-batches (``--hf-micro-batch``
     sequences each, gradients accumulated: the full batch's ``[B, T, V]`` logits do not fit),
     ``model(input_ids, attention_mask, labels)`` (full logits, HF's own cross-entropy), AdamW;
  2. hf padding-free: the strongest plain-HF setup (DataCollatorWithFlattening's layout): each
     micro-batch's sequences in one row with ``position_ids`` restarting per sequence, labels
     -100 on prompts, HF's own loss on the full logits, fused AdamW;
  3. stacx: THE trainer step that ``stacx run`` calls (no copy): ``stacx.train.model.build``
     with the recipe's ``[trainer]`` settings per ``--variants`` (``fast``: the CUDA default,
     packed varlen attention + torch.compile of the decoder layers; ``fast-nocompile``;
     ``plain``: ``trainer.fast = false``), then ``stacx.train.step.train_step`` (packing, logprobs
     only at completion positions through the chunked lm_head, the GRPO clipped loss, grad-norm
     clipping, fused AdamW), the whole batch in one micro-batch. stacx_tok_s is the best variant's.

Before timing, the two forwards are checked to agree (max |logprob difference| is reported).

Both use the same weights dtype (bf16 on GPU, fp32 on CPU), the same samples per step, and
count the same real (non-padding) tokens; tokens/s = real tokens / step wall time, median over
the measured steps. MFU = model FLOPs on real tokens / time / peak (H200 bf16 dense: 989 TF/s),
where model FLOPs are 6 * non-embedding params per token, 6 * V * H per *loss* token for the
lm_head, plus causal attention 6 * layers * heads * head_dim * L per token of a length-L
sequence (each step's FLOPs are computed the same way for both, from the real tokens).

Weight sync (the trainer publishes safetensors; an engine loads them):
  sync_inproc_ms        state dict -> safetensors file (/dev/shm) -> loaded into a second model
                        in the same process, on the device;
  sync_inproc_copy_ms   the same handoff without a file (parameter copy, device to device);
  sync_xproc_ms         safetensors file -> loaded by a model in another (spawned) process,
                        measured from the start of the save until the other process replies.

Usage: ``python tools/bench/train.py`` (GPU, Qwen3-0.6B shape of /work/shared/DESIGN.md) or
``python tools/bench/train.py --tiny`` (CPU-sized smoke run). Prints the machine, versions and
per-phase figures, then one JSON line: {hf_tok_s, stacx_tok_s, ratio, mfu, ...}.
``--stacx-only`` times the STACX variants alone; ``--profile`` adds one step under
torch.profiler per variant (the top ops by device time).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import multiprocessing as mp
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

# before CUDA starts: the HF step's huge logits fragment the cache otherwise
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import torch
import transformers
from safetensors.torch import load_model, save_model
from transformers import Qwen3Config, Qwen3ForCausalLM

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from stacx.train.attention import use_varlen_attention  # noqa: E402
from stacx.train.config import TrainerConfig  # noqa: E402
from stacx.train.forward import language_model, packed_token_logprobs  # noqa: E402
from stacx.train.losses import token_logprobs  # noqa: E402
from stacx.train.model import build  # noqa: E402
from stacx.train.packing import Sample, pack  # noqa: E402
from stacx.train.step import train_step  # noqa: E402

H200_BF16_PEAK = 989e12


def qwen3_config(tiny: bool) -> Qwen3Config:
    if tiny:
        return Qwen3Config(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=128,
            vocab_size=4096,
            tie_word_embeddings=True,
            max_position_embeddings=4096,
        )
    return Qwen3Config(
        hidden_size=1024,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=3072,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
    )


def make_batches(
    n_batches: int, n_seqs: int, lo: int, hi: int, vocab: int, seed: int
) -> list[list[Sample]]:
    """GRPO-shaped samples: lengths uniform in [lo, hi], prompt 1/8..1/2 of the sequence,
    behavior logprobs near the policy's, a per-episode advantage broadcast over its tokens."""
    rng = random.Random(seed)
    batches = []
    for _ in range(n_batches):
        batch = []
        for _ in range(n_seqs):
            length = rng.randint(lo, hi)
            p = rng.randint(length // 8, length // 2)
            ids = [rng.randrange(vocab) for _ in range(length)]
            n = length - p
            adv = rng.choice([-1.0, -0.5, 0.5, 1.0])
            values = {"advantages": [adv] * n, "behavior_logprobs": [-8.0] * n}
            batch.append(Sample(ids[:p], ids[p:], values))
        batches.append(batch)
    return batches


def step_flops(config: Qwen3Config, samples: list[Sample], n_params: int) -> float:
    v_h = config.vocab_size * config.hidden_size
    attn_width = config.num_attention_heads * config.head_dim
    flops = 0.0
    for s in samples:
        length = len(s.prompt_ids) + len(s.completion_ids)
        flops += 6 * (n_params - v_h) * length + 6 * v_h * len(s.completion_ids)
        # causal attention: QK^T and AV are 4 * L^2 * d forward, halved by the mask, x3 with backward
        flops += 6 * config.num_hidden_layers * attn_width * length * length
    return flops


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_steps(
    step: Callable[[list[Sample]], None],
    batches: list[list[Sample]],
    warmup: int,
    device: torch.device,
) -> list[float]:
    times = []
    for i, batch in enumerate(batches):
        sync(device)
        t0 = time.perf_counter()
        step(batch)
        sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def build_model(
    config: Qwen3Config, device: torch.device, dtype: torch.dtype, attn: str, seed: int
) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    config = copy.deepcopy(config)
    config._attn_implementation = attn
    with torch.device(device):  # initialize on the device: a CPU init of 0.6B params takes long
        model = Qwen3ForCausalLM(config)
    return model.to(dtype=dtype).train()


def hf_step_fn(
    model: Qwen3ForCausalLM, device: torch.device, micro_batch: int
) -> Callable[[list[Sample]], None]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def step(samples: list[Sample]) -> None:
        # gradient accumulation over micro-batches, as a plain HF loop does when the full
        # padded batch's [B, T, V] logits would not fit
        n_micro = -(-len(samples) // micro_batch)
        for i in range(0, len(samples), micro_batch):
            forward_backward(samples[i : i + micro_batch], 1.0 / n_micro)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def forward_backward(samples: list[Sample], scale: float) -> None:
        longest = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
        input_ids = torch.zeros(len(samples), longest, dtype=torch.long)
        attention = torch.zeros(len(samples), longest, dtype=torch.long)
        labels = torch.full((len(samples), longest), -100, dtype=torch.long)
        for i, s in enumerate(samples):
            ids = [*s.prompt_ids, *s.completion_ids]
            input_ids[i, : len(ids)] = torch.tensor(ids)
            attention[i, : len(ids)] = 1
            labels[i, len(s.prompt_ids) : len(ids)] = torch.tensor(s.completion_ids)
        out = model(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            labels=labels.to(device),
        )
        (out.loss * scale).backward()

    return step


def hf_packed_step_fn(
    model: Qwen3ForCausalLM, device: torch.device, micro_batch: int
) -> Callable[[list[Sample]], None]:
    """The padding-free plain-HF step (what DataCollatorWithFlattening feeds a model): each
    micro-batch's sequences concatenated into one row, ``position_ids`` restarting per
    sequence (transformers derives the block-causal attention from them), labels -100 on the
    prompts, HF's own loss on the full logits, AdamW (fused)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=device.type == "cuda")

    def step(samples: list[Sample]) -> None:
        n_micro = -(-len(samples) // micro_batch)
        for i in range(0, len(samples), micro_batch):
            ids: list[int] = []
            pos: list[int] = []
            labels: list[int] = []
            for s in samples[i : i + micro_batch]:
                seq = [*s.prompt_ids, *s.completion_ids]
                ids += seq
                pos += list(range(len(seq)))
                labels += [-100] * len(s.prompt_ids) + list(s.completion_ids)
            out = model(
                input_ids=torch.tensor([ids], device=device),
                position_ids=torch.tensor([pos], device=device),
                labels=torch.tensor([labels], device=device),
            )
            (out.loss / n_micro).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def trainer_step_fn(model: Qwen3ForCausalLM, cfg: TrainerConfig) -> Callable[[list[Sample]], None]:
    """THE trainer's step, as `stacx run` calls it: ``stacx.train.model.build`` (the recipe's
    fast path: varlen attention, compile, chunked lm_head) and ``stacx.train.step.train_step``
    (packing, the GRPO loss, grad-norm clipping, the optimizer), on ``model``'s weights."""
    trained, opt = build(cfg, None, base=model)
    steps = iter(range(1, 1 << 30))

    def step(samples: list[Sample]) -> None:
        train_step(cfg, trained, opt, samples, next(steps))

    return step


def trainer_config(variant: str, max_tokens: int) -> TrainerConfig:
    """The recipe's [trainer] settings of a variant: the whole batch in one micro-batch."""
    fast = {"fast": (True, True), "fast-nocompile": (True, False), "plain": (False, False)}
    if variant not in fast:
        raise SystemExit(f"unknown variant {variant!r}: {' | '.join(fast)}")
    on, compiled = fast[variant]
    return TrainerConfig(
        algorithm="grpo", lr=1e-6, max_tokens=max_tokens, fast=on, compile=compiled
    )


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def check_equivalence(
    config: Qwen3Config, device: torch.device, dtype: torch.dtype, samples: list[Sample], seed: int
) -> tuple[float, float]:
    """(max, mean) |logprob difference| between the plain HF forward of a padded batch and the
    STACX varlen-packed forward with the chunked head, on the same weights: the two steps
    being timed compute the same thing (up to bf16 rounding)."""
    model = build_model(config, device, dtype, "sdpa", seed).eval()
    with torch.no_grad():
        padded = pack(samples, row_tokens=1 << 30, one_per_row=True).to(device)
        logits = model(
            input_ids=padded.input_ids_R_T,
            attention_mask=(padded.sequence_index_R_T >= 0).long(),
        ).logits
        reference = padded.per_sample(token_logprobs(logits, padded.targets_R_T))
        del logits
        use_varlen_attention(model)
        batch = pack(samples, row_tokens=1 << 30, pad_to=64).to(device)
        got = batch.per_sample(packed_token_logprobs(model, batch, boundaries="varlen"))
    diffs = torch.cat([(a - b).abs() for a, b in zip(got, reference, strict=True)])
    del model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return float(diffs.max()), float(diffs.mean())


# ---- weight sync -----------------------------------------------------------------------------


def _sync_child(conn: Connection, config_dict: dict[str, object], device: str, dtype: str) -> None:
    config = Qwen3Config(**config_dict)  # type: ignore[arg-type]
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    model = model.to(dtype=getattr(torch, dtype)).eval()
    conn.send("ready")
    while (path := conn.recv()) is not None:
        t0 = time.perf_counter()
        load_model(model, path, device=device)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        conn.send((time.perf_counter() - t0) * 1e3)


def measure_sync(
    src: Qwen3ForCausalLM,
    config: Qwen3Config,
    device: torch.device,
    dtype: torch.dtype,
    repeats: int,
) -> dict[str, float]:
    shm = Path("/dev/shm")
    folder = Path(tempfile.mkdtemp(prefix="stacx-sync-", dir=shm if shm.is_dir() else None))
    path = str(folder / "model.safetensors")
    with torch.device(device):
        dst = Qwen3ForCausalLM(config)
    dst = dst.to(dtype=dtype).eval()
    file_ms, copy_ms = [], []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        save_model(src, path)
        load_model(dst, path, device=str(device))
        sync(device)
        file_ms.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        with torch.no_grad():
            for p_dst, p_src in zip(dst.parameters(), src.parameters(), strict=True):
                p_dst.copy_(p_src, non_blocking=True)
        sync(device)
        copy_ms.append((time.perf_counter() - t0) * 1e3)
    for p_dst, p_src in zip(dst.state_dict().values(), src.state_dict().values(), strict=True):
        assert torch.equal(p_dst, p_src), "weights differ after sync"
    del dst
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    config_dict = config.to_dict()
    for private in ("_attn_implementation_autoset", "_attn_implementation"):
        config_dict.pop(private, None)
    proc = ctx.Process(
        target=_sync_child,
        args=(child, config_dict, str(device), str(dtype).removeprefix("torch.")),
    )
    proc.start()
    assert parent.recv() == "ready"
    xproc_ms, child_load_ms = [], []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        save_model(src, path)
        parent.send(path)
        child_load_ms.append(parent.recv())
        xproc_ms.append((time.perf_counter() - t0) * 1e3)
    parent.send(None)
    proc.join(timeout=60)
    os.remove(path)
    os.rmdir(folder)
    return {
        "sync_inproc_ms": round(statistics.median(file_ms), 2),
        "sync_inproc_copy_ms": round(statistics.median(copy_ms), 3),
        "sync_xproc_ms": round(statistics.median(xproc_ms), 2),
        "sync_xproc_load_ms": round(statistics.median(child_load_ms), 2),
    }


def profile_step(step: Callable[[list[Sample]], None], batch: list[Sample]) -> None:
    """One step under torch.profiler: the ops that take the most device (or CPU) time."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        step(batch)
        if cuda:
            torch.cuda.synchronize()
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60))


def stacx_only(
    args: argparse.Namespace,
    config: Qwen3Config,
    device: torch.device,
    dtype: torch.dtype,
    batches: list[list[Sample]],
    tokens: list[int],
    steps: int,
) -> None:
    """The STACX variants alone (``--stacx-only``): tok/s and MFU, optionally a profile."""
    out: dict[str, object] = {"tokens_per_step": round(statistics.mean(tokens[args.warmup :]))}
    for variant in args.variants.split(","):
        model = build_model(config, device, dtype, "sdpa", args.seed)
        n_params = sum(p.numel() for p in model.parameters())
        step = trainer_step_fn(model, trainer_config(variant, max(tokens)))
        times = timed_steps(step, batches, args.warmup, device)
        flops = [step_flops(config, b, n_params) for b in batches[args.warmup :]]
        mfu = statistics.median(f / t for f, t in zip(flops, times, strict=True)) / H200_BF16_PEAK
        tok_s = statistics.median(n / t for n, t in zip(tokens[args.warmup :], times, strict=True))
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
        print(
            f"stacx[{variant}]: {tok_s:,.0f} tok/s (step {statistics.median(times) * 1e3:.0f} "
            f"ms, mfu {mfu:.3f}, peak {peak:.1f} GiB)",
            flush=True,
        )
        out[variant] = {"tok_s": round(tok_s), "mfu": round(mfu, 4), "peak_gib": round(peak, 2)}
        if args.profile:
            profile_step(step, batches[-1])
        del model, step
        free(device)
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="small model and sequences (CPU smoke run)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--seqs", type=int, default=None, help="sequences per step (default 16; tiny 8)"
    )
    ap.add_argument("--min-len", type=int, default=None)
    ap.add_argument("--max-len", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None, help="measured steps (default 5; tiny 2)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument(
        "--variants",
        default=None,
        help="trainer settings to measure, comma-separated: fast (the default of `stacx run` "
        "on CUDA: varlen attention + compile), fast-nocompile, plain (trainer.fast = false); "
        "default fast,fast-nocompile on GPU, plain on CPU. stacx_tok_s is the best one.",
    )
    ap.add_argument("--chunk-tokens", type=int, default=4096)
    ap.add_argument(
        "--hf-uniform",
        action="store_true",
        help="also time the plain HF step on the reference shape (seqs x max_len/2, no padding)",
    )
    ap.add_argument(
        "--hf-micro-batch", type=int, default=8, help="sequences per HF forward (accumulated)"
    )
    ap.add_argument("--sync-repeats", type=int, default=3)
    ap.add_argument(
        "--stacx-only", action="store_true", help="skip the HF baselines and the sync figures"
    )
    ap.add_argument(
        "--profile", action="store_true", help="profile one more step of each STACX variant"
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    n_seqs = args.seqs or (8 if args.tiny else 16)
    lo = args.min_len or (16 if args.tiny else 128)
    hi = args.max_len or (256 if args.tiny else 2048)
    steps = args.steps or (2 if args.tiny else 5)
    if args.variants is None:
        args.variants = "fast,fast-nocompile" if device.type == "cuda" else "plain"
    config = qwen3_config(args.tiny)
    batches = make_batches(args.warmup + steps, n_seqs, lo, hi, config.vocab_size, args.seed)
    tokens = [sum(len(s.prompt_ids) + len(s.completion_ids) for s in b) for b in batches]

    print(
        f"machine: {platform.node()} {platform.machine()} python {platform.python_version()} "
        f"torch {torch.__version__} transformers {transformers.__version__} device {device}"
        + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
    )
    print(
        f"batch: {n_seqs} seqs/step, lengths U[{lo},{hi}], {statistics.mean(tokens):.0f} "
        f"real tokens/step, {args.warmup} warmup + {steps} measured steps, dtype {dtype}"
    )

    max_diff, mean_diff = check_equivalence(config, device, dtype, batches[0], args.seed)
    print(
        f"equivalence: |logprob(hf padded) - logprob(stacx varlen packed)| max {max_diff:.4f} "
        f"mean {mean_diff:.5f}"
    )
    if args.stacx_only:
        stacx_only(args, config, device, dtype, batches, tokens, steps)
        return
    model = build_model(config, device, dtype, "sdpa", args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    hf_times = timed_steps(
        hf_step_fn(model, device, args.hf_micro_batch), batches, args.warmup, device
    )
    hf_peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    hf_uniform_tok_s = 0.0
    if args.hf_uniform:
        # the DESIGN.md reference shape (16 x 1024, every sequence full length, no padding):
        # shows what this harness's plain HF step gives where padding costs nothing
        seq = hi // 2
        uniform = make_batches(args.warmup + 2, n_seqs, seq, seq, config.vocab_size, args.seed)
        uniform = [
            [Sample(s.prompt_ids[:1], [*s.prompt_ids[1:], *s.completion_ids]) for s in b]
            for b in uniform
        ]
        times = timed_steps(hf_step_fn(model, device, n_seqs), uniform, args.warmup, device)
        hf_uniform_tok_s = n_seqs * seq / statistics.median(times)
        print(f"hf reference shape ({n_seqs} x {seq}, no padding): {hf_uniform_tok_s:,.0f} tok/s")
    del model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)

    model = build_model(config, device, dtype, "sdpa", args.seed)
    packed_times = timed_steps(
        hf_packed_step_fn(model, device, args.hf_micro_batch), batches, args.warmup, device
    )
    packed_peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    del model
    free(device)

    stacx_runs: dict[str, tuple[list[float], float]] = {}
    variants = args.variants.split(",")
    for variant in variants:
        model = build_model(config, device, dtype, "sdpa", args.seed)
        cfg = trainer_config(variant, max(tokens))
        step = trainer_step_fn(model, cfg)
        times = timed_steps(step, batches, args.warmup, device)
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
        stacx_runs[variant] = (times, peak)
        print(
            f"stacx[{variant}]: {statistics.median(tokens[args.warmup :][i] / t for i, t in enumerate(times)):,.0f} tok/s "
            f"(step {statistics.median(times) * 1e3:.0f} ms, peak {peak:.1f} GiB)"
        )
        if variant != variants[-1]:
            del model, step
            free(device)

    measured = batches[args.warmup :]
    real = [tokens[args.warmup + i] for i in range(steps)]
    hf_tok_s = statistics.median(t / s for t, s in zip(real, hf_times, strict=True))
    packed_tok_s = statistics.median(t / s for t, s in zip(real, packed_times, strict=True))
    per_variant = {
        v: statistics.median(t / s for t, s in zip(real, times, strict=True))
        for v, (times, _) in stacx_runs.items()
    }
    best = max(per_variant, key=lambda v: per_variant[v])
    stacx_times, stacx_peak = stacx_runs[best]
    stacx_tok_s = per_variant[best]
    flops = [step_flops(config, b, n_params) for b in measured]
    mfu = statistics.median(f / s for f, s in zip(flops, stacx_times, strict=True)) / H200_BF16_PEAK
    hf_mfu = statistics.median(f / s for f, s in zip(flops, hf_times, strict=True)) / H200_BF16_PEAK
    packed_mfu = (
        statistics.median(f / s for f, s in zip(flops, packed_times, strict=True)) / H200_BF16_PEAK
    )
    print(
        f"hf padding-free: {packed_tok_s:,.0f} tok/s  (step "
        f"{statistics.median(packed_times) * 1e3:.0f} ms, peak {packed_peak:.1f} GiB, "
        f"mfu {packed_mfu:.3f})"
    )
    print(
        f"hf:    {hf_tok_s:,.0f} tok/s  (step {statistics.median(hf_times) * 1e3:.0f} ms, "
        f"peak {hf_peak:.1f} GiB, mfu {hf_mfu:.3f})"
    )
    print(f"stacx: {stacx_tok_s:,.0f} tok/s with {best} (mfu {mfu:.3f})")

    lm = language_model(model)
    sync_figures = measure_sync(lm, config, device, dtype, args.sync_repeats)
    print("sync: " + ", ".join(f"{k} {v}" for k, v in sync_figures.items()))
    result = {
        "hf_tok_s": round(hf_tok_s),
        "stacx_tok_s": round(stacx_tok_s),
        "ratio": round(stacx_tok_s / hf_tok_s, 3),
        "hf_packed_tok_s": round(packed_tok_s),
        "ratio_vs_packed": round(stacx_tok_s / packed_tok_s, 3),
        "hf_packed_mfu": round(packed_mfu, 4),
        "mfu": round(mfu, 4),
        "hf_mfu": round(hf_mfu, 4),
        "hf_uniform_tok_s": round(hf_uniform_tok_s),
        **sync_figures,
        "logprob_max_abs_diff": round(max_diff, 5),
        "hf_peak_gib": round(hf_peak, 2),
        "stacx_peak_gib": round(stacx_peak, 2),
        "stacx_variant": best,
        "stacx_tok_s_by_variant": {v: round(x) for v, x in per_variant.items()},
        "tiny": args.tiny,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "tokens_per_step": round(statistics.mean(real)),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

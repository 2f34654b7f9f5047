"""The memory-bandwidth bound of the engine benches' decode, and a profile of it by kernel kind.

A decode step must read, at least, every weight the step uses once (the layers, the final norm
and the lm_head; of the embedding only the rows of the step's ids, counted as nothing) and the
keys and values of every running row up to its current length. Summed over a run's decode
steps, those bytes over the device's copy bandwidth are the least time decode can take:

    min_s = (steps * weight_bytes + kv_tokens * kv_token_bytes) / copy_bytes_per_s
    bound_tok_s = generated / min_s,  fraction_of_bound = tok_s / bound_tok_s

``steps``: the decode steps the engine ran (its ``decode_steps`` stat: the weights are read
once per step whatever the batch); ``kv_tokens``: the keys the generated tokens' steps attend
to (a reply of R tokens to a prompt of P: its first token comes from the prefill, token j > 1
from a step reading P + j - 1 keys), counted from the workload, so a row that runs past its
stop inside a multi-step replay adds nothing. The prefill is left out (it is compute-bound: the
bound treats it as free), so a fraction near 1 means decode itself runs at the copy bandwidth.

The copy bandwidth is measured in the same run (`copy_bandwidth`): a large device-to-device
copy (CPU: memory to memory, at torch's thread count), counting bytes read plus bytes written,
as the device notes measure it (~3.0 TB/s on an H100, ~4.3 on an H200).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch


def copy_bandwidth(device: torch.device, mib: int | None = None, reps: int = 10) -> float:
    """Bytes per second a large copy moves on `device` (read + written), the median of `reps`
    timed copies after one warm-up; buffers well past the last-level cache (GPU: 1 GiB each,
    CPU: 256 MiB)."""
    gpu = device.type == "cuda"
    n = (mib or (1024 if gpu else 256)) * 2**20 // 4
    src = torch.rand(n, device=device)  # random data: zeros may copy faster than real data
    dst = torch.empty_like(src)
    times: list[float] = []
    for i in range(reps + 1):
        if gpu:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            stop.record()
            stop.synchronize()
            elapsed = start.elapsed_time(stop) / 1e3
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            elapsed = time.perf_counter() - t0
        if i:
            times.append(elapsed)
    if not torch.equal(dst, src):
        raise RuntimeError("copy_bandwidth: the copy is wrong")
    del src, dst
    if gpu:
        torch.cuda.empty_cache()
    return 2 * n * 4 / statistics.median(times)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the parameters one decode step reads: every distinct parameter storage, less
    the input embedding unless it is tied to the lm_head (a step reads only its ids' rows)."""
    embed = model.get_input_embeddings().weight  # type: ignore[operator]
    head = model.get_output_embeddings()  # type: ignore[operator]
    tied = head is not None and head.weight.data_ptr() == embed.data_ptr()
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if p.data_ptr() in seen or (p.data_ptr() == embed.data_ptr() and not tied):
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size()
    return total


def kv_token_bytes(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Bytes of one position's keys and values over all layers, from the model's config."""
    cfg = model.config
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    return 2 * int(cfg.num_hidden_layers) * kv_heads * head_dim * torch.finfo(dtype).bits // 8


def reply_kv_tokens(prompt: int, reply: int) -> int:
    """Keys the decode steps of a `reply`-token generation after a `prompt`-token prompt read
    (its first token comes from the prefill; token j > 1 from a step over prompt + j - 1 keys)."""
    steps = max(reply - 1, 0)
    return steps * prompt + steps * (steps + 1) // 2


class Bound:
    """The bound's constants for one model on one device (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype, device: torch.device) -> None:
        self.weight_bytes = weight_bytes(model)
        self.kv_token_bytes = kv_token_bytes(model, dtype)
        self.copy_bytes_per_s = copy_bandwidth(device)

    def describe(self) -> dict[str, float]:
        return {
            "copy_gb_s": round(self.copy_bytes_per_s / 1e9, 1),
            "weight_gib": round(self.weight_bytes / 2**30, 3),
            "kv_kib_per_token": round(self.kv_token_bytes / 2**10, 2),
        }

    def of(self, generated: int, tok_s: float, steps: int, kv_tokens: int) -> dict[str, float]:
        """``bound_tok_s`` and ``fraction_of_bound`` of a run that made `generated` tokens at
        `tok_s` in `steps` decode steps whose tokens read `kv_tokens` keys, and the GB read."""
        read = steps * self.weight_bytes + kv_tokens * self.kv_token_bytes
        min_s = read / self.copy_bytes_per_s
        bound = generated / min_s if min_s > 0 else float("inf")
        return {
            "decode_read_gb": round(read / 1e9, 2),
            "bound_tok_s": round(bound, 1),
            "fraction_of_bound": round(tok_s / bound, 4),
        }


# kernel (GPU) or op (CPU) name fragments per kind, tried in this order: the token pick's
# kernels before attention's (both have a "combine"; log_softmax before softmax)
KINDS = (
    (
        "sampling",
        (
            "pick",
            "argmax",
            "log_softmax",
            "topk",
            "sort",
            "multinomial",
            "exponential",
            "cumsum",
            "sampling",
        ),
    ),
    ("attention", ("attn", "attention", "flash", "fmha", "combine", "softmax", "bmm", "sdpa")),
    (
        "gemm",
        (
            "gemm",
            "gemv",
            "matmul",
            "xmma",
            "cutlass",
            "nvjet",
            "cublas",
            "aten::mm",
            "aten::addmm",
            "aten::linear",
        ),
    ),
)


def kind_of(name: str) -> str:
    low = name.lower()
    return next((kind for kind, keys in KINDS if any(k in low for k in keys)), "other")


class Window:
    """A torch.profiler trace of a window of a running phase (the engine works in its own
    thread; device kernels are recorded whatever thread launched them, CPU ops of every
    thread): `start` and `stop` around it, then `summary` divides each kind's kernel time
    (CPU: ops' self time) by the decode steps the window saw; ``host_gaps``: the window's
    wall time not covered by kernels (CPU: by ops), per step."""

    def __init__(self, device: torch.device, steps: Callable[[], int]) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.gpu = device.type == "cuda"
        acts = [ProfilerActivity.CUDA] if self.gpu else [ProfilerActivity.CPU]
        try:  # CPU ops of the engine's worker thread too (torch >= 2.6)
            from torch._C._profiler import _ExperimentalConfig

            extra = {"experimental_config": _ExperimentalConfig(profile_all_threads=True)}
            self.prof = profile(activities=acts, **extra)  # type: ignore[arg-type]
        except (ImportError, TypeError):
            self.prof = profile(activities=acts)
        self.steps = steps
        self.t0 = self.wall = 0.0
        self.steps0 = self.n_steps = 0

    def start(self) -> None:
        self.steps0 = self.steps()
        self.prof.start()
        self.t0 = time.perf_counter()

    def stop(self) -> None:
        if self.gpu:
            torch.cuda.synchronize()
        self.wall = time.perf_counter() - self.t0
        self.n_steps = self.steps() - self.steps0
        self.prof.stop()

    def summary(self, trace: Path | None = None) -> dict[str, object]:
        per_kind = {"attention": 0.0, "gemm": 0.0, "sampling": 0.0, "other": 0.0}
        kernels = 0
        want = "CUDA" if self.gpu else "CPU"
        named: list[tuple[float, int, str]] = []
        for e in self.prof.key_averages():
            if e.device_type.name != want:
                continue
            us = e.self_device_time_total if self.gpu else e.self_cpu_time_total
            per_kind[kind_of(e.key)] += us / 1e3
            kernels += e.count
            named.append((us / 1e3, e.count, e.key))
        steps = max(self.n_steps, 1)
        busy = sum(per_kind.values())
        out: dict[str, object] = {
            "window_s": round(self.wall, 2),
            "decode_steps": self.n_steps,
            "ms_per_step": {k: round(v / steps, 3) for k, v in per_kind.items()}
            | {"host_gaps": round(max(self.wall * 1e3 - busy, 0.0) / steps, 3)},
            "kernels_per_step" if self.gpu else "ops_per_step": round(kernels / steps, 1),
            # the ten costliest kernels (ops): [name, ms per step, launches per step]
            "top": [
                [key[:60], round(ms / steps, 3), round(count / steps, 1)]
                for ms, count, key in sorted(named, reverse=True)[:10]
            ],
        }
        if trace is not None:
            self.prof.export_chrome_trace(str(trace))
            out["trace"] = str(trace)
        return out

"""One GPU, engine and trainer colocated: full GRPO iterations of a 4B/8B-shaped model via `stacx run`.

Builds a random-init bf16 model of the Qwen3-4B shape (``--shape 8b``: Qwen3-8B's; ``--tiny``: a
CPU-sized one) with the
bundled SmolLM2 tokenizer files (``--tokenizer``; ids past its vocabulary decode to nothing, so
random samples stay valid token-in/token-out), writes a recipe (ReTool agent, the process
sandbox: no Docker, the torch engine and the trainer on the one device, FSDP world 1 with
activation checkpointing, the fast path as `stacx run` defaults it), runs ``stacx run`` on it
for ``--steps`` steps (rollout v0, step, weight sync, rollout v1, ...) while sampling the GPU's
memory (nvidia-smi), then reads the run's log to report per phase:

- rollout: generated tokens / wall time of each iteration (first episode start to last finish);
- train: tokens / step time, MFU = (6 * non-embedding params * tokens + 6 * V * H * loss
  tokens) / time / 989 TF/s (the train bench's count without its attention term);
- checkpoint: ``hold_ms`` (the step's end to its publish: snapshot, handoff and, unless
  ``--background``, the write of the full weights + sharded optimizer state), ``write_ms`` (the
  write, wherever it ran: ``CheckpointSaved``), ``durable``; sync ms (``WeightsLoaded.latency_ms``:
  WeightsPublished to the engine serving the version), with its bytes and the engine's own load
  ms (``WeightsLoaded.bytes``, ``load_ms``: with LoRA, the merge);
- the trainer's cadence (the ``trainer_cadence`` view): per step ``cycle_over_step`` = (batch read
  + step + hold) / step, i.e. the trainer's time between two steps' starts when batches are
  ready over the step itself; ``trainer_cycle_over_step`` is its median over every step but the
  last (the last version is always written before it is published, so it holds for the write);
- peak GPU memory in use (nvidia-smi, whole device) within each phase's window.

The run's output is streamed line by line (flushed) and, with ``--out DIR``, copied to
``DIR/stacx_run.log``; ``--deadline-s`` stops the run (SIGINT: the launcher's orderly stop) so
that what the log holds is still reported; the JSON also goes to ``DIR/grpo_iteration.json``
and the memory samples to ``DIR/gpu_memory.csv``. Prints one JSON object as its last line.

Usage (the H200 figures of docs/benchmarks.md; model on /dev/shm to spare the disk for checkpoints):
``python tools/bench/grpo_iteration.py --tokenizer DIR --work /tmp/it --model-dir /dev/shm/m4b
--out $OUT --deadline-s 380 --steps 2 --problems 1 --group 8 --new-tokens 48 --no-compile``;
``--tiny`` runs on CPU for a check of the script. The checkpoint off the trainer's path (issue
28; goal: ``trainer_cycle_over_step`` <= 1.2 at the 4B shape): ``--background --steps 6`` (every
version written in a writer thread while the next steps run; a version whose write would find the
previous one under way is not written), ``--checkpoint-every N`` to write every N-th only.

LoRA vs full fine-tuning (``--lora RANK``): the same model and workload run twice, first with
``[trainer.lora] rank = RANK`` (alpha = 2 * RANK, every linear module), then with full weights
(``--lora-only`` skips it; a full run that does not fit is reported by its exit code and what
its log holds). The last line then holds both reports and a ``summary`` per variant (peak GPU
memory, mean train tok/s, mean sync ms and bytes, hold and write ms, the cadence) with the LoRA
/ full ratios:
``python tools/bench/grpo_iteration.py --shape 8b --lora 16 --tokenizer DIR --work /tmp/it
--model-dir /dev/shm/m8b --out $OUT --deadline-s 280 --steps 2 --problems 1 --group 8
--new-tokens 48 --no-compile``. A LoRA version is always written before it is published (see
stacx.train.trainer): ``--background`` and ``--checkpoint-every`` do not change a LoRA run's
writes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import duckdb
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

PEAK = 989e12
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")

RECIPE = """
name = "grpo-4b-colocated"
[model]
path = "{model}"
dtype = "{dtype}"
[engine]
backend = "torch"
device = "{device}"
max_batch = {max_batch}
[sandbox]
backend = "process"
concurrency = {concurrency}
[tasks]
path = "math"
include = ["train-*"]
difficulty = ["trivial"]
per_iteration = {problems}
group_size = {group}
[agent]
name = "retool"
format = "python"
max_turns = 1
max_new_tokens = {new_tokens}
temperature = 1.0
[algorithm]
name = "grpo"
mode = "sync"
[trainer]
steps = {steps}
device = "{device}"
fsdp = true
activation_checkpointing = true
compile = {compile}
optimizer = "{optimizer}"
max_tokens = 16384
keep_last = 1
checkpoint_every = {checkpoint_every}
background_checkpoint = {background}
{lora}[placement]
mode = "local"
"""


def qwen3(tiny: bool, shape: str = "4b") -> Qwen3Config:
    if tiny:
        return Qwen3Config(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=128,
            vocab_size=49152,
            tie_word_embeddings=True,
        )
    if shape == "8b":
        return Qwen3Config(
            hidden_size=4096,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            intermediate_size=12288,
            vocab_size=151936,
            tie_word_embeddings=False,
            max_position_embeddings=40960,
        )
    return Qwen3Config(
        hidden_size=2560,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=9728,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
    )


def make_model(path: Path, config: Qwen3Config, device: str, tokenizer: Path) -> int:
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    for name in TOKENIZER_FILES:
        if (tokenizer / name).is_file():
            shutil.copy(tokenizer / name, path / name)
    n = sum(p.numel() for p in model.parameters())
    del model
    return n


class GpuMemory:
    """(time, MiB used) samples of the whole GPU from ``nvidia-smi -lms``."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self.proc: subprocess.Popen[str] | None = None
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(
                [
                    "nvidia-smi",
                    "--query-gpu=timestamp,memory.used",
                    "--format=csv,noheader,nounits",
                    "-lms",
                    "200",
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                stamp, used = (x.strip() for x in line.split(","))
                t = datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp()
                self.samples.append((t, float(used)))
            except ValueError:
                continue

    def peak(self, start: float, end: float) -> float | None:
        inside = [m for t, m in self.samples if start - 0.25 <= t <= end + 0.25]
        return round(max(inside) / 1024, 2) if inside else None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()


def report(run: Path, config: Qwen3Config, n_params: int, mem: GpuMemory) -> dict[str, object]:
    con = duckdb.connect(str(run / "trace.duckdb"), read_only=True)

    def rows(sql: str) -> list[tuple[object, ...]]:
        return con.execute(sql).fetchall()

    out: dict[str, object] = {"params": n_params}
    rollouts = rows(
        "select t.weight_version, min(s.ts), max(f.ts), sum(len(t.output_ids)), count(distinct "
        "t.episode_id) from turn_generated t join episode_started s using (episode_id) join "
        "episode_finished f using (episode_id) group by 1 order by 1"
    )
    out["rollout"] = [
        {
            "weight_version": v,
            "tokens": int(n),  # type: ignore[call-overload]
            "episodes": e,
            "wall_s": round(float(b) - float(a), 2),  # type: ignore[arg-type]
            "tok_s": round(float(n) / max(float(b) - float(a), 1e-9), 1),  # type: ignore[arg-type]
            "peak_gib": mem.peak(float(a), float(b)),  # type: ignore[arg-type]
        }
        for v, a, b, n, e in rollouts
    ]
    v_h = config.vocab_size * config.hidden_size
    steps = rows(
        "select step, ts, duration_ms, n_tokens, metrics_json, world_size from "
        "train_step_finished order by step"
    )
    published = dict(rows("select version, ts from weights_published"))
    loaded = {
        v: (ts, ms, nbytes, load_ms)
        for v, ts, ms, nbytes, load_ms in rows(
            "select version, ts, latency_ms, bytes, load_ms from weights_loaded"
        )
    }
    cadence = {
        r[0]: r[1:]
        for r in rows(
            "select step, hold_s, cycle_s, cycle_over_step, gap_s, durable, write_s "
            "from trainer_cadence"
        )
    }
    out["train"] = []
    for step, ts, ms, tokens, metrics_json, world in steps:
        metrics = json.loads(str(metrics_json))
        seconds = float(ms) / 1e3  # type: ignore[arg-type]
        flops = 6 * (n_params - v_h) * int(tokens) + 6 * v_h * int(metrics["n_loss_tokens"])  # type: ignore[call-overload]
        end = float(ts)  # type: ignore[arg-type]
        pub = float(published.get(step, end))  # type: ignore[arg-type]
        load_ts, latency, nbytes, load_ms = loaded.get(step, (None, None, None, None))
        hold, cycle, ratio, gap, durable, write = cadence.get(step, (None,) * 6)
        out["train"].append(  # type: ignore[attr-defined]
            {
                "step": step,
                "world_size": world,
                "tokens": tokens,
                "step_ms": round(float(ms), 1),  # type: ignore[arg-type]
                "tok_s": round(int(tokens) / seconds, 1),  # type: ignore[call-overload]
                "mfu": round(flops / seconds / PEAK, 4),
                "hold_ms": _ms(hold),
                "cycle_ms": _ms(cycle),
                "cycle_over_step": round(float(ratio), 3) if ratio is not None else None,  # type: ignore[arg-type]
                "gap_ms": _ms(gap),
                "durable": durable,
                "write_ms": _ms(write),
                "sync_ms": round(float(latency), 1) if latency is not None else None,  # type: ignore[arg-type]
                "sync_bytes": nbytes,
                "load_ms": round(float(load_ms), 1) if load_ms is not None else None,  # type: ignore[arg-type]
                "train_peak_gib": mem.peak(end - seconds, end),
                "checkpoint_peak_gib": mem.peak(end, pub),
                "sync_peak_gib": mem.peak(pub, float(load_ts)) if load_ts is not None else None,  # type: ignore[arg-type]
            }
        )
    ratios = sorted(t["cycle_over_step"] for t in out["train"][:-1] if t["cycle_over_step"])  # type: ignore[index]
    out["trainer_cycle_over_step"] = ratios[len(ratios) // 2] if ratios else None
    return out


def _ms(seconds: object) -> float | None:
    return round(float(seconds) * 1e3, 1) if seconds is not None else None  # type: ignore[arg-type]


def run_stacx(cmd: list[str], log_path: Path | None, deadline_s: float) -> int:
    """``stacx run`` with its output streamed (flushed line by line, copied to ``log_path``);
    past ``deadline_s`` it gets SIGINT (the launcher's orderly stop: the log stays readable),
    then SIGKILL 30 s later. Returns its exit code."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    log = log_path.open("w") if log_path is not None else None
    t0 = time.perf_counter()

    def watchdog() -> None:
        while proc.poll() is None:
            if time.perf_counter() - t0 > deadline_s:
                print(f"bench: deadline {deadline_s:.0f} s reached: SIGINT", flush=True)
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                return
            time.sleep(1)

    threading.Thread(target=watchdog, daemon=True).start()
    for line in proc.stdout:
        line = f"[{time.perf_counter() - t0:6.1f}s] {line.rstrip()}"
        print(line, flush=True)
        if log is not None:
            log.write(line + "\n")
            log.flush()
    code = proc.wait()
    if log is not None:
        log.close()
    return code


def _mean(values: list[object]) -> float | None:
    nums = [float(v) for v in values if isinstance(v, int | float)]
    return round(sum(nums) / len(nums), 1) if nums else None


def summary(result: dict[str, object]) -> dict[str, object]:
    """The figures LoRA and full fine-tuning are compared on (steps after the first: the first
    step pays compilation and allocator warm-up)."""
    train = result.get("train")
    steps = train if isinstance(train, list) else []
    later = steps[1:] or steps
    return {
        "rc": result.get("stacx_run_rc"),
        "steps": len(steps),
        "peak_gib": result.get("gpu_mem_peak_run_gib"),
        "train_peak_gib": max(
            (s["train_peak_gib"] for s in steps if s["train_peak_gib"]), default=None
        ),
        "train_tok_s": _mean([s["tok_s"] for s in later]),
        "sync_ms": _mean([s["sync_ms"] for s in steps]),
        "sync_bytes": _mean([s["sync_bytes"] for s in steps]),
        "load_ms": _mean([s["load_ms"] for s in steps]),  # the engine's part of sync_ms
        "hold_ms": _mean([s["hold_ms"] for s in steps]),  # the step's end to its publish
        "write_ms": _mean([s["write_ms"] for s in steps]),
        "cycle_over_step": result.get("trainer_cycle_over_step"),
    }


def run_variant(
    args: argparse.Namespace, config: Qwen3Config, n_params: int, model_dir: Path, lora: int
) -> dict[str, object]:
    """One ``stacx run`` (LoRA of rank ``lora``, or full weights at 0) and its report."""
    device = "cpu" if args.tiny else "cuda"
    tag = f"lora{lora}" if lora else "full"
    work = args.work / tag
    work.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work / "run", ignore_errors=True)
    if device == "cuda":
        torch.cuda.empty_cache()
    recipe = work / "recipe.toml"
    recipe.write_text(
        RECIPE.format(
            model=model_dir,
            dtype="float32" if args.tiny else "bfloat16",
            device=device,
            max_batch=args.problems * args.group,
            concurrency=args.problems * args.group,
            problems=args.problems,
            group=args.group,
            new_tokens=args.new_tokens,
            steps=args.steps,
            compile="false" if args.no_compile else "true",
            optimizer=args.optimizer,
            checkpoint_every=args.checkpoint_every,
            background="true" if args.background else "false",
            lora=f"[trainer.lora]\nrank = {lora}\nalpha = {2 * lora}\n" if lora else "",
        )
    )
    mem = GpuMemory()
    time.sleep(1.0)
    baseline = mem.samples[-1][1] / 1024 if mem.samples else None  # this bench's own context
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "stacx", "run", str(recipe), "--run-dir", str(work / "run")]
    print("+", " ".join(cmd), flush=True)
    out = args.out / tag if args.out is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    code = run_stacx(cmd, out / "stacx_run.log" if out is not None else None, args.deadline_s)
    wall = time.perf_counter() - t0
    mem.stop()
    result: dict[str, object] = {
        "variant": tag,
        "stacx_run_rc": code,
        "stacx_run_wall_s": round(wall, 1),
        "gpu_mem_before_run_gib": round(baseline, 2) if baseline is not None else None,
        "gpu_mem_peak_run_gib": mem.peak(mem.samples[0][0], mem.samples[-1][0])
        if mem.samples
        else None,
    }
    try:
        result.update(report(work / "run", config, n_params, mem))
    except (duckdb.Error, OSError, KeyError, ValueError) as e:  # a killed run: say what is missing
        result["report_error"] = repr(e)
    result["recipe"] = recipe.read_text()
    if out is not None:
        (out / "grpo_iteration.json").write_text(json.dumps(result, indent=1))
        (out / "gpu_memory.csv").write_text("".join(f"{t:.2f},{m:.0f}\n" for t, m in mem.samples))
    return result


def _ratio(a: object, b: object) -> float | None:
    if isinstance(a, int | float) and isinstance(b, int | float) and b:
        return round(float(a) / float(b), 4)
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--shape", choices=("4b", "8b"), default="4b")
    ap.add_argument("--lora", type=int, default=0, help="LoRA rank: run LoRA, then full weights")
    ap.add_argument("--lora-only", action="store_true", help="with --lora: skip the full run")
    ap.add_argument("--tokenizer", type=Path, required=True, help="dir with tokenizer.json etc.")
    ap.add_argument("--work", type=Path, required=True, help="run dir and recipe go here")
    ap.add_argument(
        "--model-dir",
        type=Path,
        help="where the random model is written "
        "(default WORK/model; e.g. /dev/shm/m to spare the disk)",
    )
    ap.add_argument("--out", type=Path, help="also write the log and partial results here")
    ap.add_argument("--deadline-s", type=float, default=1e9, help="stop each stacx run after this")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--problems", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--optimizer", default="adamw", help="adamw | sgd (sgd: no optimizer state)")
    ap.add_argument(
        "--background",
        action="store_true",
        help="trainer.background_checkpoint: write checkpoints in a writer thread",
    )
    ap.add_argument("--checkpoint-every", type=int, default=1, help="trainer.checkpoint_every")
    args = ap.parse_args()
    device = "cpu" if args.tiny else "cuda"
    config = qwen3(args.tiny, args.shape)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    model_dir = args.model_dir or args.work / "model"
    t0 = time.perf_counter()
    n_params = make_model(model_dir, config, device, args.tokenizer)
    print(
        f"bench: model {n_params / 1e9:.2f}B params written to {model_dir} in "
        f"{time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    variants = [args.lora] if args.lora else [0]
    if args.lora and not args.lora_only:
        variants.append(0)
    runs = [run_variant(args, config, n_params, model_dir, rank) for rank in variants]
    result: dict[str, object] = {
        "shape": "tiny" if args.tiny else args.shape,
        "tiny": args.tiny,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "params": n_params,
    }
    if len(runs) == 1:
        result.update(runs[0])  # the single-run layout this bench always printed
    else:
        sums = {str(r["variant"]): summary(r) for r in runs}
        lora, full = sums[f"lora{args.lora}"], sums["full"]
        result["summary"] = sums
        result["lora_over_full"] = {
            k: _ratio(lora[k], full[k])
            for k in (
                "peak_gib",
                "train_peak_gib",
                "train_tok_s",
                "sync_ms",
                "sync_bytes",
                "load_ms",
            )
        }
        result["runs"] = runs
    if args.out is not None:
        (args.out / "grpo_iteration.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

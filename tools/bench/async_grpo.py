"""Async vs sync GRPO through `stacx run` on the long-tail task set: does async pay?

Runs the SAME recipe (recipes/longtail/grpo.toml: the ReTool agent on recipes/tasks/longtail,
whose verifiers take a task-specific, heavy-tailed 1-20 s of sandbox time) twice, the way a
user does (a subprocess of ``python -m stacx run RECIPE --set ...``), once with
``algorithm.mode = "sync"`` (iteration k waits for version k; a step waits for every group of
its iteration: the slowest task of the batch) and once with ``algorithm.mode = "async"`` and
``algorithm.max_staleness`` (default 2: iterations run up to two versions ahead and a step
takes the first complete groups within the staleness bound). Every figure is SQL over the two
runs' logs (``stacx.store.db.connect_run``, what ``stacx sql`` opens; the views of
events/views/50_time_accounting.sql):

- the measured span: from the first generated turn's start to the publish of the last version
  (model load and engine warm-up before the first turn are left out, the same for both);
- ``s_per_step`` = span / steps, ``steps_per_hour``, ``gen_tokens_per_s`` (output ids of the
  turns that ended in the span / span);
- ``engine_busy`` / ``trainer_busy`` / ``sandbox_busy``: the share of the span in which at
  least one request was being generated / the trainer was reading a batch, stepping or writing
  its checkpoint / at least one tool or verifier ran (``busy_islands`` clipped to the span);
- ``reward_by_version``: {version: [mean reward, episodes]} (``reward_by_weight_version``);
- ``mean_staleness``: the trainer's batches' mean ``max_staleness`` (versions behind);
- ``trainer_cycle_over_step`` (``trainer_cadence_run``): the trainer's time per step (batch read +
  step + snapshot/publish; checkpoints are written in the background,
  ``trainer.background_checkpoint``) over the step itself;
- ``time_accounting_run``: the ``time_accounting_run`` view (the whole log, model load included):
  role -> [busy_s, idle_s, busy_frac, work_s, tokens_per_s].

The last line printed is one JSON object: both modes' figures and ``speedup`` (async steps/hour
over sync). Sizes:

    python tools/bench/async_grpo.py --tiny            # CPU (the 2-core machine: minutes)
    python tools/bench/async_grpo.py --device cuda     # one GPU, engine and trainer on it (< 9 min)

Placement: the CPU runs keep one process (``placement.mode`` "auto" is "local" there); the cuda
runs get the GPU default, "processes": the engine in a process of its own serving two rollout
worker processes, the trainer in a third, weights handed over by CUDA IPC; every process's
event-loop lag, CPU and forks are in the JSON (``process_load``, the view ``process_load_run``).
``--set placement.mode=local`` measures the one-process topology instead.

``--tiny`` runs 4 steps of 2 tasks x 4 samples, one turn of up to 16 tokens, the last decoder
layer and the final norm trained. ``--device cuda`` runs 8 steps of 4 tasks x 8 samples, 3 turns
of up to 96 tokens, the default model (SmolLM2-135M) trained whole, after a 1-step warm-up run
(not measured: it pays the Triton JIT and compile caches both measured runs then share); the
async run makes 1.5x the steps (``--async-steps``: 12), so that the time it takes to reach the
reward sync ended with is measured (``async_time_to_sync_final_over_sync``); each
measured run is stopped at 190 s (warm-up 130 s) and then measured on the steps it made, so the
whole script ends within 9 minutes. ``--set KEY=VALUE`` is passed to every run. Run order:
warm-up, sync, async. Each run's output goes to WORK/<mode>.log.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "longtail" / "grpo.toml"
sys.path.insert(0, str(ROOT))  # measure() reads the logs with stacx, installed or not

# CPU: one short turn per episode and a light step, so the sandbox tail is not lost in the
# 2 cores' generation and training time
TINY_SETS = [
    "agent.max_turns=1",
    "agent.max_new_tokens=16",
    "trainer.trainable='^model\\.(norm|layers\\.29)\\.'",
    "trainer.background_checkpoint=true",
]
CUDA_SETS = [
    "engine.device=cuda",
    "trainer.device=cuda",
    "engine.max_batch=64",
    # placement "processes" (the GPU default): the engine, two rollout workers of 64 episodes
    # each and the trainer in processes of their own
    "placement.rollout_workers=2",
    "sandbox.concurrency=64",
    "tasks.per_iteration=4",
    "tasks.group_size=8",
    "agent.max_turns=3",
    "agent.max_new_tokens=96",
    "agent.temperature=0.7",
    "trainer.lr=1e-4",
    "trainer.trainable=''",
    "trainer.compile=false",
    "trainer.background_checkpoint=true",
]

SPAN = """
SELECT (SELECT min(ts - gen_ms / 1000.0) FROM turn_generated) AS t0,
       (SELECT max(ts) FROM weights_published WHERE version = (SELECT max(step) FROM train_steps)) AS t1,
       (SELECT count(*) FROM train_steps) AS steps
"""
BUSY = """
SELECT role, sum(greatest(0, least(t1, $b) - greatest(t0, $a))) / ($b - $a) AS frac
FROM busy_islands WHERE t1 > $a AND t0 < $b GROUP BY role
"""
TOKENS = "SELECT coalesce(sum(len(output_ids)), 0) FROM turn_generated WHERE ts <= $b"
REWARDS = """
SELECT weight_version, reward_mean, n_episodes FROM reward_by_weight_version
WHERE split = 'train' ORDER BY weight_version
"""
# the reward each version's episodes reached, against the wall time (from the span's start) at
# which that version was published: what a user compares ("where is each mode after an hour")
REWARD_VS_TIME = """
SELECT r.weight_version, round(coalesce(p.t, $a) - $a, 2) AS t_s, r.reward_mean, r.n_episodes
FROM reward_by_weight_version r
LEFT JOIN (SELECT version, min(ts) AS t FROM weights_published GROUP BY version) p
       ON p.version = r.weight_version
WHERE r.split = 'train' ORDER BY r.weight_version
"""
LOAD = """
SELECT process, lag_p50_ms, lag_p99_ms, cpu_share, rss_mb, forks, saturated_windows
FROM process_load_run ORDER BY process
"""
ACCOUNTING = "SELECT role, busy_s, idle_s, busy_frac, work_s, tokens_per_s FROM time_accounting_run"
STALENESS = (
    "SELECT avg(try_cast(json_extract(metrics_json, '$.max_staleness') AS DOUBLE)) FROM train_steps"
)
CADENCE = "SELECT cycle_over_step, hold_s / nullif(steps, 0) FROM trainer_cadence_run"


def stacx_run(run_dir: Path, sets: list[str], timeout_s: float) -> tuple[float, bool]:
    """Run `stacx run` on the recipe; (wall seconds, whether it finished). A run past
    `timeout_s` is stopped (its process group: the run's nats-server too) and measured on the
    steps its log holds."""
    cmd = [sys.executable, "-m", "stacx", "run", str(RECIPE), "--run-dir", str(run_dir), "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    print("$", " ".join(cmd[1:]), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    log = (run_dir.parent / f"{run_dir.name}.log").open("w")
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        print(f"bench: {run_dir.name} stopped at its {timeout_s:.0f} s limit", file=sys.stderr)
        return time.perf_counter() - t0, False
    finally:
        log.close()
    if rc != 0:
        tail = (run_dir.parent / f"{run_dir.name}.log").read_text()[-4000:]
        raise SystemExit(f"stacx run failed ({rc}):\n{tail}")
    return time.perf_counter() - t0, True


def measure(run_dir: Path) -> dict[str, object]:
    """The figures of one run, from its log (see the module docstring)."""
    from stacx.store import db

    con = db.connect_run(run_dir)
    try:
        a, b, steps = con.execute(SPAN).fetchone() or (None, None, 0)
        if a is None or b is None or not steps:
            raise SystemExit(f"{run_dir}: no turns or no published step in the log")
        span = float(b) - float(a)
        busy = dict(con.execute(BUSY, {"a": a, "b": b}).fetchall())
        (tokens,) = con.execute(TOKENS, {"b": b}).fetchone() or (0,)
        rewards = {
            str(v): [round(float(r), 4) if r is not None else None, int(n)]
            for v, r, n in con.execute(REWARDS).fetchall()
        }
        reward_vs_time = [
            [int(v), float(t), round(float(r), 4) if r is not None else None, int(n)]
            for v, t, r, n in con.execute(REWARD_VS_TIME, {"a": a}).fetchall()
        ]
        load = {
            str(proc): {
                "lag_p50_ms": p50,
                "lag_p99_ms": p99,
                "cpu_share": cpu,
                "rss_mb": rss,
                "forks": int(forks or 0),
                "saturated_windows": int(sat or 0),
            }
            for proc, p50, p99, cpu, rss, forks, sat in con.execute(LOAD).fetchall()
        }
        (staleness,) = con.execute(STALENESS).fetchone() or (None,)
        cycle, hold = con.execute(CADENCE).fetchone() or (None, None)
        accounting = {
            role: [round(float(x or 0), 3) for x in rest]
            for role, *rest in con.execute(ACCOUNTING).fetchall()
        }
    finally:
        con.close()
    return {
        "steps": int(steps),
        "span_s": round(span, 2),
        "s_per_step": round(span / steps, 3),
        "steps_per_hour": round(3600 * steps / span, 1),
        "gen_tokens_per_s": round(float(tokens) / span, 2),
        "engine_busy": round(float(busy.get("engine", 0.0)), 3),
        "trainer_busy": round(float(busy.get("trainer", 0.0)), 3),
        "sandbox_busy": round(float(busy.get("sandbox", 0.0)), 3),
        "mean_staleness": round(float(staleness), 3) if staleness is not None else None,
        # the trainer's time per step (batch read + step + until published) over the step
        "trainer_cycle_over_step": round(float(cycle), 3) if cycle is not None else None,
        "trainer_hold_s_per_step": round(float(hold), 3) if hold is not None else None,
        "reward_by_version": rewards,
        # [version, seconds from the span's start to its publish (v0: 0), mean reward, episodes]
        "reward_vs_time": reward_vs_time,
        # per process (launcher, engine-0, rollout-N, trainer-0): event-loop lag, CPU, forks
        "process_load": load,
        # the whole log (model load included): role -> [busy_s, idle_s, busy_frac, work_s, tokens/s]
        "time_accounting_run": accounting,
    }


def time_to_reward(sync: list[list[float]], asyn: list[list[float]]) -> dict[str, object]:
    """When async first reached the reward sync ended with (the mean of sync's last two
    versions, to damp one version's noise), against sync's time to its last version."""
    scored = [row for row in sync if row[2] is not None]
    if len(scored) < 2:
        return {"sync_final_reward": None, "async_time_to_sync_final_over_sync": None}
    target = sum(row[2] for row in scored[-2:]) / 2
    sync_t = scored[-1][1]
    hit = next((row[1] for row in asyn if row[2] is not None and row[2] >= target), None)
    return {
        "sync_final_reward": round(target, 4),
        "sync_time_to_final_s": sync_t,
        "async_time_to_sync_final_s": hit,
        "async_time_to_sync_final_over_sync": (
            round(hit / sync_t, 3) if hit is not None and sync_t else None
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--tiny", action="store_true", help="CPU, the recipe as committed (default)")
    size.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--steps", type=int, help="train steps per run (default: 4 tiny, 8 cuda)")
    ap.add_argument(
        "--async-steps",
        type=int,
        help="train steps of the async run (default: 1.5x --steps on cuda, so it can reach the "
        "reward sync ends with; --steps on the CPU)",
    )
    ap.add_argument("--staleness", type=int, default=2, help="async max_staleness (default 2)")
    ap.add_argument("--warmup-steps", type=int, help="unmeasured warm-up run (default 0 / 1 cuda)")
    ap.add_argument(
        "--timeout-s",
        type=float,
        help="limit per measured stacx run, then it is "
        "measured on the steps it made (default 1800; cuda 190, warm-up 130)",
    )
    ap.add_argument("--work", type=Path, help="run dirs go here (default: a temp dir)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    cuda = args.device == "cuda" and not args.tiny
    steps = args.steps or (8 if cuda else 4)
    async_steps = args.async_steps or (steps * 3 // 2 if cuda else steps)
    warmup = args.warmup_steps if args.warmup_steps is not None else (1 if cuda else 0)
    limit = args.timeout_s or (190.0 if cuda else 1800.0)
    base = [*(CUDA_SETS if cuda else TINY_SETS), f"trainer.steps={steps}", *args.sets]
    work = args.work or Path(tempfile.mkdtemp(prefix="async-grpo-"))
    work.mkdir(parents=True, exist_ok=True)
    old = [d.name for d in (work / "warmup", work / "sync", work / "async") if d.exists()]
    if old:  # `stacx run` would resume them and the bench report the old runs' figures
        raise SystemExit(f"bench: {work} already holds runs {old}: pass a new --work directory")
    print(
        f"bench: {platform.node()} python {platform.python_version()}, work {work}", file=sys.stderr
    )
    if warmup:
        stacx_run(
            work / "warmup",
            [*base, f"trainer.steps={warmup}", "algorithm.mode=sync"],
            min(limit, 130.0) if cuda else limit,
        )
    out: dict[str, object] = {
        "bench": "async_grpo",
        "device": "cuda" if cuda else "cpu",
        "recipe": str(RECIPE.relative_to(ROOT)),
        "sets": base,
    }
    for mode, extra in (
        ("sync", ["algorithm.mode=sync"]),
        (
            "async",
            [
                "algorithm.mode=async",
                f"algorithm.max_staleness={args.staleness}",
                f"trainer.steps={async_steps}",
            ],
        ),
    ):
        wall, finished = stacx_run(work / mode, [*base, *extra], limit)
        out[mode] = {"wall_s": round(wall, 1), "finished": finished, **measure(work / mode)}
        print(f"bench: {mode}: {json.dumps(out[mode])}", file=sys.stderr, flush=True)
    sync, asyn = out["sync"], out["async"]
    assert isinstance(sync, dict) and isinstance(asyn, dict)
    out["speedup"] = round(asyn["steps_per_hour"] / sync["steps_per_hour"], 3)
    out["tokens_per_s_ratio"] = round(
        asyn["gen_tokens_per_s"] / max(sync["gen_tokens_per_s"], 1e-9), 3
    )
    out.update(time_to_reward(sync["reward_vs_time"], asyn["reward_vs_time"]))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

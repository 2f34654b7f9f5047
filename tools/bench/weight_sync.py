"""Weight-sync latency on the path `stacx run` uses: the trainer publishes a version, the rollout
worker's WeightSync loads it into the engine and records ``WeightsLoaded.latency_ms`` (from the
``WeightsPublished`` timestamp to the moment the engine serves the new version).

Two runs of the same tiny GRPO recipe (`recipes/swe/grpo_tiny.toml`, one task, a group of 2,
one short turn, ``--steps`` versions), in the same invocation:

  file_ms    baseline: ``trainer.inprocess_handoff = false``: WeightSync checks the
             checkpoint's sha256 and loads the safetensors file (the cross-process path);
  inproc_ms  the default: the trainer's snapshot is handed over in memory.

Median latency of the versions >= 1 of each run, read from its log with SQL. Prints the machine
and versions, then one JSON line.

    python tools/bench/weight_sync.py [--device cpu|cuda] [--steps 3] [--trainable REGEX]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from stacx.store import db  # noqa: E402  (after the sys.path insert)


def run(run_dir: Path, device: str, steps: int, trainable: str, inproc: bool) -> list[float]:
    sets = [
        f"trainer.steps={steps}",
        "tasks.per_iteration=1",
        "tasks.group_size=2",
        "tasks.include=['create-hello-file']",
        "agent.max_turns=1",
        "agent.max_new_tokens=16",
        f"trainer.trainable='{trainable}'",
        f"trainer.inprocess_handoff={'true' if inproc else 'false'}",
        f"engine.device='{device}'",
        f"trainer.device='{device}'",
        "logging.progress='off'",
        "logging.plot=false",
    ]
    args = [sys.executable, "-m", "stacx", "run", str(ROOT / "recipes/swe/grpo_tiny.toml")]
    args += ["--run-dir", str(run_dir), "--quiet", *(a for s in sets for a in ("--set", s))]
    subprocess.run(args, cwd=ROOT, check=True, capture_output=True)
    con = db.connect_run(run_dir)
    try:
        rows = con.execute(
            "select latency_ms from weights_loaded where version >= 1 order by version"
        ).fetchall()
    finally:
        con.close()
    return [float(r[0]) for r in rows]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument(
        "--trainable", default="", help="trainer.trainable ('' = the whole model, a full sync)"
    )
    args = p.parse_args()
    import torch

    print(f"machine: {platform.node()} {platform.machine()}, torch {torch.__version__}, "
          f"device {args.device}", file=sys.stderr)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="stacx-bench-sync-") as tmp:
        file_ms = run(Path(tmp) / "file", args.device, args.steps, args.trainable, inproc=False)
        inproc_ms = run(Path(tmp) / "inproc", args.device, args.steps, args.trainable, inproc=True)
    out = {
        "bench": "weight_sync",
        "device": args.device,
        "versions": len(inproc_ms),
        "file_ms": round(statistics.median(file_ms), 1),
        "inproc_ms": round(statistics.median(inproc_ms), 1),
        "ratio": round(statistics.median(file_ms) / max(statistics.median(inproc_ms), 1e-9), 2),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""Weight-sync latency through the real path: WeightsPublished on the bus -> WeightSync -> engine.

In one run, on one machine, with the default model (or ``--model``) in an in-process TorchEngine:

  baseline_file_ms  engine.load_weights(path) called directly: read the safetensors file and copy
                    it into the engine (no bus, no digest check);
  inproc_ms         the in-process handoff: the trainer's snapshot is offered in memory, a
                    WeightsPublished is emitted, WeightSync copies it into the engine and emits
                    WeightsLoaded; latency_ms of that event (from WeightsPublished.ts);
  file_verified_ms  the cross-process path: nothing in memory, WeightSync checks the file's
                    sha256 and loads the file; latency_ms of WeightsLoaded.

Median over ``--repeats``. Prints the machine and versions, then one JSON line.

    python tools/bench/weight_sync.py [--device cpu|cuda] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from stacx import events as ev
from stacx.actors.run import RunContext
from stacx.inference.torch_engine import TorchEngine
from stacx.launch.weights import InProcessWeights, WeightSync
from stacx.train import checkpoint
from stacx.train.trainer import load_model


async def wait_loaded(run: RunContext, version: int) -> float:
    while True:
        rows = (
            await run.query(f"select latency_ms from weights_loaded where version = {version}")
        ).to_pylist()
        if rows:
            return float(rows[0]["latency_ms"])
        await asyncio.sleep(0.01)


async def main(args: argparse.Namespace) -> dict[str, object]:
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    engine = TorchEngine(args.model, device=args.device, dtype=dtype, max_len=512)
    model = load_model(args.model, device, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    params = sum(p.numel() for p in model.parameters())
    base: list[float] = []
    inproc: list[float] = []
    verified: list[float] = []
    version = 0
    with tempfile.TemporaryDirectory() as tmp:
        async with RunContext(Path(tmp) / "run", recipe="bench-weight-sync") as run:
            handoff = InProcessWeights()
            run.spawn(WeightSync(engine, label="bench", handoff=handoff))
            for _ in range(args.repeats):
                version += 1
                path, sha = checkpoint.save(run.run_dir, version, model, opt, {})
                start = time.perf_counter()
                await engine.load_weights(str(path), version)
                base.append((time.perf_counter() - start) * 1e3)
                for in_memory, out in ((True, inproc), (False, verified)):
                    version += 1
                    path, sha = checkpoint.save(run.run_dir, version, model, opt, {})
                    if in_memory:
                        snap = {k: v.detach().clone() for k, v in model.named_parameters()}
                        handoff.offer(str(path), sha, snap)
                    else:
                        handoff.offer("", "", {})
                    await run.emit(
                        ev.WeightsPublished(
                            run_id=run.run_id,
                            version=version,
                            path=str(path),
                            sha256=sha,
                            step=version,
                        )
                    )
                    out.append(await wait_loaded(run, version))
                    assert engine.weight_version == version
    await engine.close()
    size_mb = params * (2 if dtype == torch.bfloat16 else 4) / 2**20
    return {
        "model": args.model,
        "device": str(device),
        "params_m": round(params / 1e6, 1),
        "weights_mb": round(size_mb, 1),
        "baseline_file_ms": round(statistics.median(base), 1),
        "inproc_ms": round(statistics.median(inproc), 1),
        "file_verified_ms": round(statistics.median(verified), 1),
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="default")
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    print(
        f"# {platform.node()} {platform.processor() or platform.machine()} python "
        f"{platform.python_version()} torch {torch.__version__}"
    )
    print(json.dumps(asyncio.run(main(a))))

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

``--mode transports`` (no Docker, e.g. the H200): the three transports of WeightSync on a
Qwen3-0.6B-shaped bf16 model (``--tiny``: a small one), each timed through the real
``WeightSync._load`` that the rollout worker runs (its published ``WeightsLoaded.latency_ms``,
from the moment the trainer would publish): a trainer in ANOTHER process (spawned) saves each
version with ``checkpoint.save`` and offers it to its ``SharedWeights`` (what a Ray role host
does); the engine's process runs a TorchEngine and loads that version

  shared_ms  across processes: CUDA IPC buffer (CPU: /dev/shm), no file read;
  file_ms    baseline: sha256 check + safetensors load of the checkpoint;
  memory_ms  in process: a snapshot handed over in memory (InProcessWeights).

    python tools/bench/weight_sync.py --mode transports --device cuda [--versions 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from stacx.events import WeightsPublished  # noqa: E402  (after the sys.path insert)
from stacx.store import db  # noqa: E402


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
        "eval={}",  # the sync's latency, not the recipe's held-out eval
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


def qwen3_config(tiny: bool) -> dict[str, Any]:
    if tiny:
        return dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=128,
            vocab_size=512,
            tie_word_embeddings=True,
        )
    return dict(
        hidden_size=1024,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=3072,
        vocab_size=151936,
        tie_word_embeddings=True,
    )


def _trainer(conn: Connection, config: dict[str, Any], device: str, run_dir: str, n: int) -> None:
    """The trainer's process: per version, change the weights, save the checkpoint, offer it to
    this process's SharedWeights (as the Trainer in a Ray role host does), report."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from stacx.train import checkpoint
    from stacx.weights.share import SharedWeights

    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(Qwen3Config(**config)).to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    share = SharedWeights()
    for v in range(1, n + 1):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1e-3)
        path, sha = checkpoint.save(run_dir, v, model, opt, {})
        state = {k: p.detach().clone() for k, p in model.named_parameters()}
        t0 = time.perf_counter()
        share.offer(str(path), sha, state)
        offer_ms = (time.perf_counter() - t0) * 1e3
        del state
        conn.send((str(path), sha, offer_ms, time.time()))
        assert conn.recv() == "next"
    share.close()


def transports(device: str, n: int, tiny: bool) -> dict[str, object]:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from stacx.actors.base import ActorContext, Watermark
    from stacx.events import Event, WeightsLoaded
    from stacx.hf import read_safetensors
    from stacx.inference.torch_engine import TorchEngine
    from stacx.weights.share import SharedWeights
    from stacx.weights.sync import InProcessWeights, WeightSync

    config = qwen3_config(tiny)
    with torch.device(device):
        model = Qwen3ForCausalLM(Qwen3Config(**config)).to(torch.bfloat16)
    engine = TorchEngine(model, device=device, dtype=torch.bfloat16, max_batch=8, max_len=512)
    loaded: list[WeightsLoaded] = []

    async def record(event: Event) -> int:
        assert isinstance(event, WeightsLoaded)
        loaded.append(event)
        return len(loaded)

    def sync_actor(handoff: InProcessWeights | SharedWeights | None, tmp: str) -> WeightSync:
        actor = WeightSync(engine, label="bench", handoff=handoff)
        actor.bind(
            ActorContext(
                run_id="bench",
                run_dir=tmp,
                publish=record,
                query=None,  # type: ignore[arg-type]
                head=None,
                js=None,  # type: ignore[arg-type]
                nc=None,  # type: ignore[arg-type]
                watermark=Watermark(),
            )
        )
        return actor

    def check(path: str) -> None:
        want = read_safetensors(path)
        own = engine.model.state_dict()
        bad = [k for k, t in want.items() if not torch.equal(own[k], t.to(own[k].device))]
        assert not bad, f"weights differ after the sync: {bad[:3]}"

    figures: dict[str, list[float]] = {"shared": [], "file": [], "memory": [], "offer": []}
    with tempfile.TemporaryDirectory(prefix="stacx-bench-xsync-") as tmp:
        ctx = mp.get_context("spawn")
        conn, child = ctx.Pipe()
        proc = ctx.Process(target=_trainer, args=(child, config, device, tmp, n))
        proc.start()
        memory = InProcessWeights()
        shared, file, inproc = (
            sync_actor(SharedWeights(), tmp),
            sync_actor(None, tmp),
            sync_actor(memory, tmp),
        )

        async def one(actor: WeightSync, event: WeightsPublished) -> float:
            await actor._load(event)
            assert (
                loaded[-1].transport
                == {id(shared): "shared", id(file): "file", id(inproc): "memory"}[id(actor)]
            ), loaded[-1]
            return loaded[-1].latency_ms

        for v in range(1, n + 1):
            path, sha, offer_ms, ts = conn.recv()
            event = WeightsPublished(
                run_id="bench", version=v, path=path, sha256=sha, step=v, ts=ts
            )
            # v1 warms every path up (CUDA IPC open, allocator); later versions are timed
            shared_ms = asyncio.run(one(shared, event))
            check(path)
            file_ms = asyncio.run(one(file, fresh(event)))
            snapshot = {k: t.to(device) for k, t in read_safetensors(path).items()}
            memory.offer(path, sha, snapshot)
            memory_ms = asyncio.run(one(inproc, fresh(event)))
            if v > 1:
                for key, ms in (
                    ("shared", shared_ms),
                    ("file", file_ms),
                    ("memory", memory_ms),
                    ("offer", offer_ms),
                ):
                    figures[key].append(ms)
            print(
                f"v{v}: shared {shared_ms:.1f} ms, file {file_ms:.1f} ms, memory "
                f"{memory_ms:.1f} ms (trainer's pack {offer_ms:.1f} ms)",
                flush=True,
            )
            del snapshot
            conn.send("next")
        proc.join(60)
    asyncio.run(engine.close())
    med = {k: round(statistics.median(v), 1) for k, v in figures.items() if v}
    n_params = sum(p.numel() for p in model.parameters())
    return {
        "bench": "weight_sync_transports",
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "params": n_params,
        "versions_timed": n - 1,
        "shared_ms": med.get("shared"),
        "file_ms": med.get("file"),
        "memory_ms": med.get("memory"),
        "trainer_pack_ms": med.get("offer"),
        "file_over_shared": round(med["file"] / max(med["shared"], 1e-9), 1) if med else None,
    }


def fresh(event: WeightsPublished) -> WeightsPublished:
    """The same publication with a fresh timestamp (latency is measured from it)."""
    import msgspec

    return msgspec.structs.replace(event, ts=time.time())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--mode", default="run", choices=["run", "transports"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--versions", type=int, default=4, help="transports: versions (first: warm-up)")
    p.add_argument("--tiny", action="store_true", help="transports: a small model")
    p.add_argument(
        "--trainable", default="", help="trainer.trainable ('' = the whole model, a full sync)"
    )
    args = p.parse_args()
    import torch

    print(
        f"machine: {platform.node()} {platform.machine()}, torch {torch.__version__}, "
        f"device {args.device}",
        file=sys.stderr,
    )
    if args.mode == "transports":
        print(json.dumps(transports(args.device, args.versions, args.tiny)), flush=True)
        return
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

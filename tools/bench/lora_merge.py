"""What serving a LoRA adapter costs the torch engine: the merge at load, and decode tok/s.

Loads a model into the torch engine (``--model``, default the bundled SmolLM2-135M; ``--qwen3-0.6b``:
the DESIGN.md bench shape, random init), writes a rank-``--rank`` adapter over every linear module
of its decoder with the trainer's own code (stacx.train.lora, random nonzero B), then measures

- the merge: ``engine.load_adapter`` of the adapter directory, ``--loads`` times (each version
  merges against the kept base), against a full-weights ``load_state`` of the same modules;
- decode: greedy tok/s of ``--batch`` prompts x ``--new-tokens`` on the base weights and with the
  adapter merged (the ratio is the cost of serving base + adapter at decode).

Prints one JSON object as its last line. Usage: ``python tools/bench/lora_merge.py`` (CPU here),
``python tools/bench/lora_merge.py --device cuda --qwen3-0.6b --batch 64`` (the H200).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from stacx.inference.torch_engine import TorchEngine
from stacx.ports import SamplingParams
from stacx.train import lora
from stacx.train.config import LoraConfig, TrainerConfig
from stacx.train.model import load_model


def base_model(args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    if not args.qwen3_06b:
        return load_model(
            args.model, device, torch.float32 if device.type == "cpu" else torch.bfloat16
        )
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        hidden_size=1024,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=3072,
        vocab_size=151936,
        tie_word_embeddings=True,
    )
    with torch.device(device):
        return Qwen3ForCausalLM(config).to(torch.bfloat16)


def write_adapter(base: torch.nn.Module, rank: int, directory: Path) -> dict[str, torch.Tensor]:
    cfg = TrainerConfig(lora=LoraConfig(rank=rank, alpha=2.0 * rank))
    adapted = lora.wrap(copy.deepcopy(base), cfg)
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if ".lora_" in name:
                p.normal_(0, 0.02)
    state = lora.adapter_state(dict(adapted.named_parameters()))
    directory.mkdir(parents=True, exist_ok=True)
    lora.write(directory, state, lora.peft_config_of(adapted))
    return {k: v.detach().clone() for k, v in state.items()}


async def decode_tok_s(engine: TorchEngine, args: argparse.Namespace) -> float:
    prompts = [[1 + (7 * i + j) % 500 for j in range(args.prompt)] for i in range(args.batch)]
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
    await engine.generate(prompts[:1], SamplingParams(max_new_tokens=4, ignore_eos=True))
    t0 = time.perf_counter()
    gens = await engine.generate(prompts, params)
    return sum(len(g.output_ids) for g in gens) / (time.perf_counter() - t0)


async def measure(args: argparse.Namespace) -> dict[str, object]:
    device = torch.device(args.device)
    base = base_model(args, device)
    directory = Path(tempfile.mkdtemp(prefix="stacx-lora-bench-"))
    state = write_adapter(base, args.rank, directory)
    names = {k.removeprefix("base_model.model.").rsplit(".lora_", 1)[0] + ".weight" for k in state}
    full = {n: t.detach().clone() for n, t in base.named_parameters() if n in names}
    engine = TorchEngine(base, device=args.device, max_len=args.prompt + args.new_tokens + 8)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    try:
        base_tok_s = await decode_tok_s(engine, args)
        merges, copies = [], []
        for version in range(1, args.loads + 1):
            t0 = time.perf_counter()
            await engine.load_adapter(str(directory), version, state)
            sync()
            merges.append((time.perf_counter() - t0) * 1e3)
        lora_tok_s = await decode_tok_s(engine, args)
        for version in range(args.loads + 1, 2 * args.loads + 1):
            t0 = time.perf_counter()
            await engine.load_state(full, version)  # the same modules as full weights
            sync()
            copies.append((time.perf_counter() - t0) * 1e3)
    finally:
        await engine.close()
    adapter_bytes = lora.adapter_bytes(state)
    full_bytes = lora.adapter_bytes(full)
    return {
        "model": "qwen3-0.6b-shape" if args.qwen3_06b else args.model,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "rank": args.rank,
        "adapted_modules": len(names),
        "adapter_bytes": adapter_bytes,
        "adapted_weights_bytes": full_bytes,
        "merge_ms_median": round(statistics.median(merges), 2),
        "full_copy_ms_median": round(statistics.median(copies), 2),
        "decode_tok_s_base": round(base_tok_s, 1),
        "decode_tok_s_merged": round(lora_tok_s, 1),
        "decode_ratio_merged_over_base": round(lora_tok_s / base_tok_s, 3),
        "batch": args.batch,
        "new_tokens": args.new_tokens,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--qwen3-0.6b", dest="qwen3_06b", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--loads", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    print(json.dumps(asyncio.run(measure(ap.parse_args()))), flush=True)


if __name__ == "__main__":
    main()

"""LoRA through the front door: `stacx run` of the tiny ReTool GRPO and SFT recipes (process
sandbox, no Docker) with ``trainer.lora.rank = 8`` reach weights v2, and what each version moves
into the rollout engine is the adapter: a few MB (far below the model), and the turns the engine
then generated are exactly base + that adapter's (their recorded logprobs are re-scored by a
fresh engine with the adapter merged). SFT on every sample (``filter = 'true'``) always has a
gradient, so there v1 must also differ from the base model (a GRPO group whose rewards tie has
zero advantages, and its first adapter can still be B = 0: the base)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stacx.hf import resolve_model
from stacx.inference.torch_engine import TorchEngine
from stacx.store import db
from stacx.weights.sync import load_published

pytestmark = [pytest.mark.model, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SETS = [
    "trainer.lora.rank=8",
    "trainer.lora.target_modules=['q_proj','v_proj','down_proj']",
    "trainer.steps=2",
    "trainer.lr=0.005",  # large enough that v1's adapter visibly moves the logprobs
    "eval={}",
    "tasks.per_iteration=1",
    "tasks.group_size=2",
    "agent.max_turns=1",
    "agent.max_new_tokens=8",
    "logging.plot=false",
    "logging.progress='off'",
]
LOADED = "select version, transport, bytes, adapter from weights_loaded order by version"
V1_TURN = """select prompt_ids, output_ids, logprobs from turn_generated
where weight_version = 1 and coalesce(prefix_len, 0) = 0 and len(coalesce(versions, [])) = 0
order by _seq limit 1"""


def _scores(engine: TorchEngine, prompt: list[int], output: list[int]) -> torch.Tensor:
    return torch.tensor(asyncio.run(engine.score(prompt, output)))


# grpo_tiny only: sft_tiny syncs its adapter through the same trainer path (the suite's CPU budget)
@pytest.mark.parametrize("recipe", ["grpo_tiny"])
def test_lora_run_syncs_the_adapter_only(tmp_path: Path, recipe: str) -> None:
    run_dir = tmp_path / "r"
    sets = [*SETS, *(["trainer.filter='true'"] if recipe == "sft_tiny" else [])]
    cmd = [sys.executable, "-m", "stacx", "run", str(ROOT / f"recipes/retool/{recipe}.toml")]
    cmd += ["--run-dir", str(run_dir), "--quiet", *(a for s in sets for a in ("--set", s))]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    con = db.connect_run(run_dir)
    try:
        loaded = con.execute(LOADED).fetchall()
        published = dict(con.execute("select version, path from weights_published").fetchall())
        turn = con.execute(V1_TURN).fetchone()
    finally:
        con.close()
    assert [v for v, *_ in loaded] == [1, 2]
    model_bytes = sum(
        f.stat().st_size for f in Path(resolve_model("default")).glob("*.safetensors")
    )
    for _, transport, nbytes, adapter in loaded:
        assert adapter and transport == "memory"
        assert 0 < nbytes < model_bytes / 50, (nbytes, model_bytes)
    assert turn is not None, "no single-version turn at v1"
    prompt, output, recorded = list(turn[0]), list(turn[1]), torch.tensor(turn[2])
    engine = TorchEngine("default", device="cpu", max_len=2048, threads=1)
    try:
        base = _scores(engine, prompt, output)
        asyncio.run(load_published(engine, published[1], 1))
        merged = _scores(engine, prompt, output)
    finally:
        asyncio.run(engine.close())
    torch.testing.assert_close(merged, recorded.float(), atol=1e-3, rtol=0)
    if recipe == "sft_tiny":
        assert (base - recorded).abs().max() > 1e-2  # the engine did not serve the base

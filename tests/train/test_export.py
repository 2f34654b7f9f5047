"""`stacx models export`: a partial checkpoint laid over the run's base model, loadable as is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stacx.actors.run import RunContext
from stacx.hf import load_hf_model, read_safetensors, resolve_model
from stacx.train import checkpoint
from stacx.train.checkpoint import CheckpointError
from stacx.train.export import export_hf

pytestmark = pytest.mark.model
TRAINED = "model.layers.29.mlp.down_proj.weight"


async def test_export_overlays_trained_tensors_on_the_base(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    async with RunContext(run_dir, recipe="t", config={"model": {"path": "default"}}):
        pass
    model, _, _ = load_hf_model("default", torch.device("cpu"), torch.float32)
    for name, p in model.named_parameters():
        p.requires_grad_(name == TRAINED)
    with torch.no_grad():
        dict(model.named_parameters())[TRAINED].add_(1.0)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    checkpoint.save(run_dir, 3, model, opt, {"step": 3}, only_trainable=True)

    out = export_hf(run_dir, tmp_path / "exported")
    base = read_safetensors(resolve_model("default"))
    exported = read_safetensors(out)
    assert set(exported) == set(base)
    assert torch.equal(exported[TRAINED], base[TRAINED] + 1.0)
    other = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(exported[other], base[other])
    reloaded, tokenizer, _ = load_hf_model(str(out), torch.device("cpu"), torch.float32)
    assert tokenizer is not None
    assert torch.equal(dict(reloaded.named_parameters())[TRAINED], exported[TRAINED])

    with pytest.raises(CheckpointError, match=r"no checkpoint v9; have \[3\]"):
        export_hf(run_dir, tmp_path / "x", version=9)
    with pytest.raises(CheckpointError, match="exists; refusing"):
        export_hf(run_dir, out)


def test_export_cli_names_a_missing_run_dir(tmp_path: Path) -> None:
    cli = subprocess.run(
        [sys.executable, "-m", "stacx", "models", "export", str(tmp_path / "nope"), "-o", "x"],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 2 and "does not exist" in cli.stderr

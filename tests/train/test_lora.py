"""LoRA in the one trainer (``[trainer.lora]``, stacx.train.lora): only the adapter trains, a
checkpoint is a PEFT adapter directory that peft itself loads, a resume from it continues
bit-exactly, two FSDP ranks (gloo, CPU) step like one, and `stacx models export` writes the
adapter or the merged model."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from stacx.actors.run import RunContext
from stacx.errors import ConfigError
from stacx.hf import read_safetensors
from stacx.train import checkpoint, lora
from stacx.train.config import LoraConfig, TrainerConfig, load
from stacx.train.distributed import RankGroup
from stacx.train.export import export_hf
from stacx.train.model import build
from stacx.train.step import train_step
from tests.train.test_distributed import (
    assert_same_step,
    assert_same_weights,
    model_dir,  # noqa: F401  (the module-scoped tiny Qwen3 fixture)
    samples,
)


def lora_config(directory: Path, algorithm: str = "grpo", **kw: object) -> TrainerConfig:
    return TrainerConfig(
        algorithm=algorithm,
        model=str(directory),
        lr=1e-2,
        max_tokens=40,
        lora=LoraConfig(rank=4, alpha=8.0),
        **kw,  # type: ignore[arg-type]
    )


def adapter(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in lora.adapter_state(dict(model.named_parameters())).items()}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"lora": {"rank": 0}}, r"trainer\.lora\.rank = 0: accepted values are an integer >= 1"),
        ({"lora": {"dropout": 1.0}}, r"trainer\.lora\.dropout = 1\.0"),
        ({"lora": {"target_modules": []}}, r"trainer\.lora\.target_modules = \[\]"),
        ({"lora": {"rnak": 8}}, r"trainer\.lora.*accepted keys are rank, alpha, dropout"),
    ],
)
def test_bad_lora_values_name_the_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(data)


def test_targets_that_match_nothing_fail_at_build(model_dir: Path) -> None:  # noqa: F811
    cfg = msgspec.structs.replace(
        lora_config(model_dir), lora=LoraConfig(target_modules=["c_attn"])
    )
    with pytest.raises(ConfigError, match=r"trainer\.lora\.target_modules = \['c_attn'\]"):
        build(cfg, None)


def test_only_the_adapter_trains_and_a_resume_is_exact(model_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    cfg = lora_config(model_dir, trainable=r"layers\.1\.")  # adapters on layer 1 only
    model, opt = build(cfg, None)
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    train_step(cfg, model, opt, samples(1, "grpo"), 1)
    snap = lora.snapshot(1, model, opt, {"step": 1})
    path, sha = checkpoint.write(tmp_path, snap)
    state = dict(snap.weights)
    assert sha == checkpoint.sha256_file(path)
    assert state and all(".layers.1." in k for k in state)  # trainable chose the modules
    assert all(k.startswith("base_model.model.") for k in state)  # PEFT's names
    assert (path.parent / lora.ADAPTER_FILE).samefile(path)  # one file, two names
    for n, p in model.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p, base[n]), n  # the base never moves
    # peft reads the directory as its own adapter, and computes what the trainer computes
    ids = torch.tensor([[5, 17, 3, 44, 60, 2]])
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), path.parent)
    with torch.no_grad():
        torch.testing.assert_close(peft(input_ids=ids).logits, model(input_ids=ids).logits)
    train_step(cfg, model, opt, samples(2, "grpo"), 2)
    want = adapter(model)
    again, opt2 = build(cfg, str(path), version=1)  # a restarted trainer at v1
    train_step(cfg, again, opt2, samples(2, "grpo"), 2)
    got = adapter(again)
    assert sorted(got) == sorted(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k


def test_two_ranks_lora_step_and_resume_like_one(model_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    cfg = lora_config(model_dir, world_size=2)
    one_cfg = msgspec.structs.replace(cfg, world_size=1)
    batch1, batch2 = samples(1, "grpo"), samples(2, "grpo")
    model, opt = build(one_cfg, None)
    ref1 = train_step(one_cfg, model, opt, batch1, 1)
    after1 = adapter(model)
    ref2 = train_step(one_cfg, model, opt, batch2, 2)
    after2 = adapter(model)
    group = RankGroup(cfg)
    try:
        group.start(None)
        assert_same_step(ref1, group.step(batch1, 1))
        path, _sha, state = group.save(tmp_path, 1, {"step": 1})
        assert_same_weights(after1, state)  # the gathered adapter only, under PEFT's names
        assert (path.parent / lora.ADAPTER_CONFIG).is_file()
        group.load(str(path), 1)
        assert_same_step(ref2, group.step(batch2, 2))
        _path, _sha, state = group.save(tmp_path, 2, {"step": 2})
        assert_same_weights(after2, state)
    finally:
        group.close()


async def test_export_writes_the_adapter_or_the_merged_model(
    model_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    async with RunContext(run_dir, recipe="t", config={"model": {"path": str(model_dir)}}):
        pass
    cfg = lora_config(model_dir)
    model, opt = build(cfg, None)
    train_step(cfg, model, opt, samples(1, "grpo"), 1)
    checkpoint.write(run_dir, lora.snapshot(1, model, opt, {"step": 1}))

    out = export_hf(run_dir, tmp_path / "adapter")
    assert sorted(p.name for p in out.iterdir()) == [
        lora.ADAPTER_CONFIG,
        lora.ADAPTER_FILE,
        "stacx-export.json",
    ]
    config = json.loads((out / lora.ADAPTER_CONFIG).read_text())
    assert config["base_model_name_or_path"] == str(model_dir)

    merged = export_hf(run_dir, tmp_path / "merged", merged=True)
    plain = AutoModelForCausalLM.from_pretrained(merged)  # no peft needed to load it
    ids = torch.tensor([[5, 17, 3, 44, 60, 2]])
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, model(input_ids=ids).logits)
    name = "model.layers.0.self_attn.q_proj.weight"
    base = read_safetensors(model_dir)[name]
    assert not torch.equal(read_safetensors(merged)[name], base)  # the adapter is in it

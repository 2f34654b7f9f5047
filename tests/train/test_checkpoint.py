"""Checkpoints: weights and optimizer state round-trip exactly; writes are atomic; pruning."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from stacx.train import checkpoint
from stacx.train.checkpoint import CheckpointError


def tiny_model(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(cfg)


def trained(seed: int) -> tuple[LlamaForCausalLM, torch.optim.AdamW]:
    model = tiny_model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 256, (2, 12))
    for _ in range(2):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_round_trip_restores_weights_and_optimizer_state(tmp_path: Path) -> None:
    model, opt = trained(0)
    path, sha = checkpoint.save(tmp_path, 3, model, opt, {"step": 3})
    assert path == tmp_path / "checkpoints" / "v3" / "model.safetensors"
    assert sha == checkpoint.sha256_file(path)
    fresh, fresh_opt = tiny_model(1), None
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    meta = checkpoint.load(path, fresh, fresh_opt)
    assert meta["step"] == 3 and meta["version"] == 3
    for (name, a), (_, b) in zip(
        model.state_dict().items(), fresh.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    # tied weights stay tied after loading
    assert fresh.lm_head.weight.data_ptr() == fresh.model.embed_tokens.weight.data_ptr()
    saved, loaded = opt.state_dict(), fresh_opt.state_dict()
    assert saved["state"].keys() == loaded["state"].keys()
    for k, state in saved["state"].items():
        assert torch.equal(state["exp_avg"], loaded["state"][k]["exp_avg"])
        assert torch.equal(state["exp_avg_sq"], loaded["state"][k]["exp_avg_sq"])
        assert float(state["step"]) == float(loaded["state"][k]["step"]) == 2.0
    # the restored optimizer continues exactly as the original would
    ids = torch.randint(0, 256, (2, 12))
    for m, o in ((model, opt), (fresh, fresh_opt)):
        m(input_ids=ids, labels=ids).loss.backward()
        o.step()
    assert torch.equal(model.model.norm.weight, fresh.model.norm.weight)


def test_resave_replaces_and_leaves_no_temporaries(tmp_path: Path) -> None:
    model, opt = trained(0)
    checkpoint.save(tmp_path, 1, model, opt, {})
    other, other_opt = trained(5)
    path, sha = checkpoint.save(tmp_path, 1, other, other_opt, {})
    assert sha == checkpoint.sha256_file(path)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["v1"]
    fresh = tiny_model(9)
    checkpoint.load(path, fresh)
    assert torch.equal(fresh.model.norm.weight, other.model.norm.weight)


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"v7/model\.safetensors do not exist"):
        checkpoint.load(tmp_path / "v7" / "model.safetensors", tiny_model(0))
    model, opt = trained(0)
    path, _ = checkpoint.save(tmp_path, 2, model, opt, {})
    (path.parent / "optimizer.pt").unlink()
    with pytest.raises(CheckpointError, match=r"optimizer\.pt does not exist"):
        checkpoint.load(path, tiny_model(0), torch.optim.AdamW(tiny_model(0).parameters()))
    bigger = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
        )
    )
    with pytest.raises(CheckpointError, match="does not fit the model"):
        checkpoint.load(path, bigger)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_failed_sharded_optimizer_write_is_a_checkpoint_error(tmp_path: Path) -> None:
    """torch.distributed.checkpoint raises CheckpointException, a BaseException that no
    `except Exception` catches; the trainer's actor would lose it with its task (seen on an H200
    when an 8B full fine-tune filled the disk: the run hung). It must come out as the infra
    error `CheckpointError`, naming where and why."""
    model, opt = trained(0)
    (tmp_path / "file").write_text("not a directory")
    part = checkpoint.sharded_optimizer_part(model, opt)
    with pytest.raises(
        CheckpointError,
        match=r"writing .*file/optimizer failed \(rank 0: "
        r"NotADirectoryError.*GiB free there\)",
    ):
        part(tmp_path / "file")
    part(tmp_path / "dir")  # the same state writes where it can
    assert (tmp_path / "dir" / "optimizer" / ".metadata").is_file()


def test_prune_keeps_the_newest_and_the_milestones(tmp_path: Path) -> None:
    model, opt = trained(0)
    for v in range(1, 8):
        checkpoint.save(tmp_path, v, model, opt, {})
    removed = checkpoint.prune(tmp_path, 7, keep_last=2, save_every=3)
    assert removed == [1, 2, 4, 5]
    assert checkpoint.versions(tmp_path) == [3, 6, 7]
    assert checkpoint.prune(tmp_path, 7, keep_last=0, save_every=0) == []


def test_partial_checkpoint_holds_trainable_parameters_only(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    model, opt = trained(0)
    for name, p in model.named_parameters():
        p.requires_grad_(name == "model.norm.weight")
    path, _ = checkpoint.save(tmp_path, 1, model, opt, {}, only_trainable=True)
    assert list(load_file(str(path))) == ["model.norm.weight"]
    base = tiny_model(0)  # the same base weights, untrained norm
    checkpoint.load(path, base)
    assert torch.equal(base.model.norm.weight, model.model.norm.weight)

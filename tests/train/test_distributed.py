"""The sharded trainer: a 2-rank FSDP2 step (gloo, CPU) equals the 1-rank step on the same batch.

Drives the trainer's own code: ``stacx.train.model.build`` + ``stacx.train.step.train_step`` for
one rank, ``stacx.train.distributed.RankGroup`` (this process is rank 0, rank 1 a spawned
process) for two. Loss, grad norm and updated weights agree to fp32 tolerance, for the GRPO
and the SFT loss; a group rebuilt from the sharded checkpoint (weights + the DCP optimizer
shards) continues exactly as the one-rank trainer that never stopped; the checkpoint directory
is a loadable HF model.
"""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

from stacx.train.checkpoint import tied_aliases
from stacx.train.config import TrainerConfig
from stacx.train.distributed import RankGroup, shard_by_tokens
from stacx.train.model import build
from stacx.train.packing import Sample
from stacx.train.step import StepResult, train_step

VOCAB = 96


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    path = tmp_path_factory.mktemp("tiny-qwen3")
    Qwen3ForCausalLM(config).save_pretrained(path)
    return path


def samples(seed: int, algorithm: str, n: int = 7) -> list[Sample]:
    """Sequences of uneven length, so the two shards get different numbers of micro-batches."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p, c = rng.randint(3, 12), rng.randint(4, 20)
        ids = [rng.randrange(VOCAB) for _ in range(p + c)]
        if algorithm == "grpo":
            adv = rng.choice([-1.0, 0.5, 1.0])
            values = {"advantages": [adv] * c, "behavior_logprobs": [-4.6] * c}
            out.append(Sample(ids[:p], ids[p:], values))
        else:
            mask = [rng.randint(0, 1) | (i == 0) for i in range(c)]
            out.append(Sample(ids[:p], ids[p:], loss_mask=mask))
    return out


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    drop = tied_aliases(model)
    return {n: t.detach().clone() for n, t in model.state_dict().items() if n not in drop}


def assert_same_step(one: StepResult, two: StepResult) -> None:
    assert two.n_samples == one.n_samples and two.n_tokens == one.n_tokens
    assert two.n_loss_tokens == one.n_loss_tokens
    assert two.loss == pytest.approx(one.loss, rel=1e-5, abs=1e-6)
    assert two.grad_norm == pytest.approx(one.grad_norm, rel=1e-5)
    for k, v in one.metrics.items():
        assert two.metrics[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k


def assert_same_weights(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> None:
    """To 0.1% of one AdamW step (lr 1e-2): Adam divides by sqrt(v) + eps, so a gradient that is
    ~eps amplifies fp32 reordering for the odd element; a wrong reduction moves whole tensors."""
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-4, atol=1e-5, msg=name)


def config(model_dir: Path, algorithm: str, **kw: object) -> TrainerConfig:
    # max_tokens 40: several micro-batches per shard, unequal between the ranks
    return TrainerConfig(
        algorithm=algorithm,
        model=str(model_dir),
        lr=1e-2,
        max_tokens=40,
        world_size=2,
        **kw,  # type: ignore[arg-type]
    )


def test_shards_balance_tokens_and_keep_every_sample() -> None:
    batch = samples(3, "grpo", n=9)
    shards = shard_by_tokens(batch, 2)
    assert sorted(map(id, (s for shard in shards for s in shard))) == sorted(map(id, batch))
    loads = [sum(s.n_positions for s in shard) for shard in shards]
    assert max(loads) - min(loads) <= max(s.n_positions for s in batch)
    assert shard_by_tokens(batch[:1], 2)[1] == []  # fewer samples than ranks: an empty shard


def test_two_ranks_step_and_resume_like_one_grpo(model_dir: Path, tmp_path: Path) -> None:
    cfg = config(model_dir, "grpo")
    one_cfg = msgspec.structs.replace(cfg, world_size=1)
    batch1, batch2 = samples(1, "grpo"), samples(2, "grpo")
    model, opt = build(one_cfg, None)
    ref1 = train_step(one_cfg, model, opt, batch1, 1)
    after1 = weights(model)
    ref2 = train_step(one_cfg, model, opt, batch2, 2)
    after2 = weights(model)

    group = RankGroup(cfg)
    try:
        group.start(None)
        assert_same_step(ref1, group.step(batch1, 1))
        path, _sha, state = group.save(tmp_path, 1, {"step": 1})
        assert_same_weights(after1, state)
        assert (path.parent / "optimizer" / ".metadata").is_file()  # sharded optimizer state
        hf = AutoModelForCausalLM.from_pretrained(path.parent)  # a loadable HF directory
        assert_same_weights(after1, weights(hf))
        # resume: every rank rebuilds from the checkpoint (weights + optimizer shards)
        group.load(str(path), 1)
        assert_same_step(ref2, group.step(batch2, 2))
        _path, _sha, state = group.save(tmp_path, 2, {"step": 2})
        assert_same_weights(after2, state)
    finally:
        group.close()


def test_two_ranks_step_like_one_sft_with_a_rank_left_without_samples(
    model_dir: Path, tmp_path: Path
) -> None:
    cfg = config(model_dir, "sft")
    one_cfg = msgspec.structs.replace(cfg, world_size=1)
    batch, single = samples(4, "sft"), samples(5, "sft", n=1)
    model, opt = build(one_cfg, None)
    ref = train_step(one_cfg, model, opt, batch, 1)
    ref_single = train_step(one_cfg, model, opt, single, 2)  # rank 1 gets no sample
    expected = weights(model)

    group = RankGroup(cfg)
    try:
        group.start(None)
        assert_same_step(ref, group.step(batch, 1))
        assert_same_step(ref_single, group.step(single, 2))
        _path, _sha, state = group.save(tmp_path, 2, {"step": 2})
        assert_same_weights(expected, state)
    finally:
        group.close()

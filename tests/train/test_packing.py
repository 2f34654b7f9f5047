"""Packing: layout properties, and a packed forward of a real (tiny, random) transformers model
giving the same per-token logprobs as running each sequence alone."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from stacx.train.attention import use_varlen_attention
from stacx.train.forward import ModelShapeError, packed_token_logprobs
from stacx.train.losses import token_logprobs
from stacx.train.packing import (
    PackingError,
    Sample,
    assign_rows,
    pack,
    pack_shared,
    shared_positions,
)

SAMPLES = [
    Sample([1, 2, 3], [4, 5], {"adv": [0.5, 0.5]}),
    Sample([6], [7, 8, 9, 10], {"adv": [-1.0, -2.0, -3.0, -4.0]}, loss_mask=[1, 0, 1, 1]),
    Sample([11, 12, 13, 14, 15], [16], {"adv": [2.0]}),
    Sample([17, 18], [19, 20, 21], {"adv": [0.1, 0.2, 0.3]}),
]


def test_first_fit_decreasing_fills_rows_without_overflow() -> None:
    rows = assign_rows([5, 4, 3, 3, 2, 1], row_tokens=6)
    assert rows == [[0, 5], [1, 4], [2, 3]]
    assert all(sum([5, 4, 3, 3, 2, 1][i] for i in r) <= 6 for r in rows)


def test_pack_layout_targets_positions_and_values() -> None:
    batch = pack(SAMPLES, row_tokens=8)
    assert batch.n_tokens == sum(s.n_positions for s in SAMPLES) == 4 + 4 + 5 + 4
    # every sample lies whole in one row, positions restart at 0, targets are the next ids
    for i, s in enumerate(SAMPLES):
        ids = [*s.prompt_ids, *s.completion_ids]
        where = (batch.sequence_index_R_T == i).nonzero()
        assert where[:, 0].unique().numel() == 1
        row = int(where[0, 0])
        cols = where[:, 1]
        assert batch.input_ids_R_T[row, cols].tolist() == ids[:-1]
        assert batch.targets_R_T[row, cols].tolist() == ids[1:]
        assert batch.position_ids_R_T[row, cols].tolist() == list(range(len(ids) - 1))
    per_sample_targets = batch.per_sample(batch.targets_R_T)
    assert per_sample_targets[1].tolist() == [7, 9, 10]  # loss_mask drops completion id 8
    assert batch.per_sample(batch.values_R_T["adv"])[1].tolist() == [-1.0, -3.0, -4.0]
    assert batch.per_sample(batch.targets_R_T)[0].tolist() == [4, 5]
    assert not batch.loss_mask_R_T[batch.sequence_index_R_T < 0].any()


def test_cu_seqlens_cover_the_flattened_batch() -> None:
    batch = pack(SAMPLES, row_tokens=8, pad_to=4)
    r, t = batch.input_ids_R_T.shape
    assert t % 4 == 0
    assert int(batch.cu_seqlens[-1]) == r * t
    lengths = (batch.cu_seqlens[1:] - batch.cu_seqlens[:-1]).tolist()
    # segments start exactly where position_ids restart at 0
    starts = (batch.position_ids_R_T.reshape(-1) == 0).nonzero().squeeze(1).tolist()
    assert starts == batch.cu_seqlens[:-1].tolist()
    assert batch.max_seqlen == max(lengths)


def test_block_causal_mask_never_crosses_sequences() -> None:
    batch = pack(SAMPLES, row_tokens=16)
    mask = batch.block_causal_mask()[:, 0]
    seq = batch.sequence_index_R_T
    for r in range(mask.shape[0]):
        i, j = mask[r].nonzero().unbind(1)
        assert (j <= i).all()
        assert (seq[r, i] == seq[r, j]).all()
    assert mask.any(dim=-1).all()  # no fully masked row (would give NaN in softmax)


def test_one_per_row_is_a_padded_batch() -> None:
    batch = pack(SAMPLES, row_tokens=64, one_per_row=True)
    assert batch.input_ids_R_T.shape == (4, 5)
    assert batch.sequence_index_R_T[:, 0].tolist() == [0, 1, 2, 3]


def test_pack_rejects_too_long_and_inconsistent_samples() -> None:
    with pytest.raises(PackingError, match="sample 0: 6 ids do not fit a row of 4"):
        pack([Sample([1, 2, 3], [4, 5, 6])], row_tokens=4)
    with pytest.raises(PackingError, match=r"token_values\['adv'\] has 1 entries for 2"):
        pack([Sample([1], [2, 3], {"adv": [1.0]})], row_tokens=8)
    with pytest.raises(PackingError, match="non-empty completion"):
        pack([Sample([1, 2], [])], row_tokens=8)


@pytest.fixture(scope="module")
def tiny_model() -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    config._attn_implementation = "sdpa"
    return Qwen3ForCausalLM(config).eval().to(torch.float64)


def _reference_logprobs(model: Qwen3ForCausalLM, sample: Sample) -> list[float]:
    ids = torch.tensor([[*sample.prompt_ids, *sample.completion_ids]])
    logits = model(input_ids=ids).logits[0, :-1]
    lp = token_logprobs(logits, ids[0, 1:])
    first = len(sample.prompt_ids) - 1
    mask = sample.loss_mask or [1] * len(sample.completion_ids)
    return [float(x) for x, m in zip(lp[first:], mask, strict=True) if m]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("boundaries", ["position_ids", "block_mask"])
def test_packed_forward_equals_unpacked(
    tiny_model: Qwen3ForCausalLM, impl: str, boundaries: str
) -> None:
    tiny_model.config._attn_implementation = impl
    try:
        batch = pack(SAMPLES, row_tokens=12)
        assert batch.input_ids_R_T.shape[0] < len(SAMPLES)  # it really packed
        with torch.no_grad():
            lp = packed_token_logprobs(tiny_model, batch, boundaries=boundaries, chunk_tokens=3)  # type: ignore[arg-type]
            for i, got in enumerate(batch.per_sample(lp)):
                expected = _reference_logprobs(tiny_model, SAMPLES[i])
                assert got.tolist() == pytest.approx(expected, abs=1e-5), (i, impl, boundaries)
    finally:
        tiny_model.config._attn_implementation = "sdpa"


def test_varlen_attention_forward_equals_unpacked(tiny_model: Qwen3ForCausalLM) -> None:
    batch = pack(SAMPLES, row_tokens=12, pad_to=8)  # two rows, each with a padding segment
    with pytest.raises(ModelShapeError, match="use_varlen_attention"):
        packed_token_logprobs(tiny_model, batch, boundaries="varlen")
    with torch.no_grad():
        expected = [_reference_logprobs(tiny_model, s) for s in SAMPLES]
    use_varlen_attention(tiny_model)
    try:
        with torch.no_grad():
            lp = packed_token_logprobs(tiny_model, batch)  # "auto" picks varlen for this model
        for i, got in enumerate(batch.per_sample(lp)):
            assert got.tolist() == pytest.approx(expected[i], abs=1e-5)
    finally:
        tiny_model.set_attn_implementation("sdpa")


def test_packed_forward_gradients_equal_unpacked(tiny_model: Qwen3ForCausalLM) -> None:
    batch = pack(SAMPLES, row_tokens=12)
    tiny_model.zero_grad()
    packed_token_logprobs(tiny_model, batch)[batch.loss_mask_R_T].sum().backward()
    packed_grad = tiny_model.model.layers[0].self_attn.q_proj.weight.grad.clone()  # type: ignore[union-attr]
    tiny_model.zero_grad()
    total = torch.zeros((), dtype=torch.float64)
    for s in SAMPLES:
        ids = torch.tensor([[*s.prompt_ids, *s.completion_ids]])
        lp = token_logprobs(tiny_model(input_ids=ids).logits[0, :-1], ids[0, 1:])
        mask = torch.tensor(s.loss_mask or [1] * len(s.completion_ids), dtype=torch.bool)
        total = total + lp[len(s.prompt_ids) - 1 :][mask].sum()
    total.backward()
    ref_grad = tiny_model.model.layers[0].self_attn.q_proj.weight.grad
    assert ref_grad is not None
    assert torch.allclose(packed_grad, ref_grad, atol=1e-8)
    tiny_model.zero_grad()


# Two GRPO-like groups (4 and 2 completions of one prompt each), a lone sample, and a
# one-token prompt: what pack_shared must lay out with one prompt copy per group.
GROUPED = [
    Sample([1, 2, 3, 4], [5, 6], {"adv": [0.5, 0.5]}),
    Sample([9, 8, 7], [6, 5, 4], {"adv": [1.0, 2.0, 3.0]}, loss_mask=[1, 0, 1]),
    Sample([1, 2, 3, 4], [7], {"adv": [-1.0]}),
    Sample([1, 2, 3, 4], [8, 9, 10], {"adv": [0.1, 0.2, 0.3]}),
    Sample([9, 8, 7], [11], {"adv": [4.0]}),
    Sample([1, 2, 3, 4], [12, 13], {"adv": [0.7, 0.8]}),
    Sample([20], [21, 22], {"adv": [0.0, 1.0]}),
]


def test_pack_shared_lays_out_one_prompt_per_group() -> None:
    batch = pack_shared(GROUPED, row_tokens=64)
    assert batch.shares_prompts and batch.input_ids_R_T.shape[0] == 1
    plain = sum(s.n_positions for s in GROUPED)
    assert batch.n_tokens == shared_positions(GROUPED) == plain - 3 * 3 - 1 * 2
    assert batch.n_loss_tokens == pack(GROUPED, row_tokens=64).n_loss_tokens
    # each completion's values sit on the positions whose targets are its tokens
    for i, s in enumerate(GROUPED):
        where = (batch.sequence_index_R_T == i) & batch.loss_mask_R_T
        mask = s.loss_mask or [1] * len(s.completion_ids)
        kept = [c for c, m in zip(s.completion_ids, mask, strict=True) if m]
        assert batch.targets_R_T[where].tolist() == kept
        assert batch.values_R_T["adv"][where].tolist() == pytest.approx(
            [v for v, m in zip(s.token_values["adv"], mask, strict=True) if m]
        )
    # a row too small for a whole group splits it, each part with its own prompt copy
    split = pack_shared(GROUPED, row_tokens=8)
    assert split.n_tokens > batch.n_tokens and split.n_loss_tokens == batch.n_loss_tokens


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_pack_shared_forward_and_gradients_equal_unpacked(
    tiny_model: Qwen3ForCausalLM, impl: str
) -> None:
    tiny_model.config._attn_implementation = impl
    try:
        batch = pack_shared(GROUPED, row_tokens=24)
        tiny_model.zero_grad()
        lp = packed_token_logprobs(tiny_model, batch, chunk_tokens=3)  # "auto" -> block mask
        for i, got in enumerate(batch.per_sample(lp.detach())):
            expected = _reference_logprobs(tiny_model, GROUPED[i])
            # HF's attention keeps its softmax in fp32 even for an fp64 model: a branch's row is
            # longer (masked entries of sibling branches), so agreement is to fp32 precision
            # (a wrong mask is off by ~1e-1)
            assert got.tolist() == pytest.approx(expected, abs=1e-6), (i, impl)
        lp[batch.loss_mask_R_T].sum().backward()
        shared_grad = tiny_model.model.layers[0].self_attn.k_proj.weight.grad.clone()  # type: ignore[union-attr]
        tiny_model.zero_grad()
        total = torch.zeros((), dtype=torch.float64)
        for s in GROUPED:  # each sequence alone
            ids = torch.tensor([[*s.prompt_ids, *s.completion_ids]])
            lp1 = token_logprobs(tiny_model(input_ids=ids).logits[0, :-1], ids[0, 1:])
            mask = torch.tensor(s.loss_mask or [1] * len(s.completion_ids), dtype=torch.bool)
            total = total + lp1[len(s.prompt_ids) - 1 :][mask].sum()
        total.backward()
        alone_grad = tiny_model.model.layers[0].self_attn.k_proj.weight.grad
        assert alone_grad is not None
        assert torch.allclose(shared_grad, alone_grad, rtol=1e-5, atol=1e-6)
    finally:
        tiny_model.zero_grad()
        tiny_model.config._attn_implementation = "sdpa"


def test_pack_shared_refuses_the_varlen_attention(tiny_model: Qwen3ForCausalLM) -> None:
    with pytest.raises(ModelShapeError, match="shared prompts"):
        packed_token_logprobs(tiny_model, pack_shared(GROUPED, 24), boundaries="varlen")


def test_grpo_step_with_shared_prompts_equals_the_plain_step(tiny_model: Qwen3ForCausalLM) -> None:
    """The trainer's default (trainer.share_prompts) changes the cost, not the update."""
    import copy

    from stacx.train.config import TrainerConfig
    from stacx.train.step import make_optimizer, train_step

    samples = [
        Sample(
            s.prompt_ids,
            s.completion_ids,
            {
                "behavior_logprobs": [-4.0] * len(s.completion_ids),
                "advantages": [float(v) for v in s.token_values["adv"]],
            },
            s.loss_mask,
        )
        for s in GROUPED
    ]
    results, params = [], []
    for share in (False, True):
        model = copy.deepcopy(tiny_model)
        cfg = TrainerConfig(algorithm="grpo", lr=1e-2, share_prompts=share, max_tokens=24)
        opt = make_optimizer(cfg, list(model.parameters()))
        results.append(train_step(cfg, model, opt, samples, 1))
        params.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    plain, shared = results
    assert shared.n_tokens < plain.n_tokens and shared.n_loss_tokens == plain.n_loss_tokens
    assert shared.loss == pytest.approx(plain.loss, rel=1e-6)
    assert shared.grad_norm == pytest.approx(plain.grad_norm, rel=1e-5)
    assert torch.allclose(params[0], params[1], atol=1e-7)

"""Properties of the in-process engine beyond the shared contract: exactness against
transformers, prefix reuse, in-memory weight loads, cancellation, seeded sampling."""

from __future__ import annotations

import asyncio
import functools

import pytest
import torch

from stacx.errors import EngineError
from stacx.inference.decoder import Decoder
from stacx.inference.engine_warmup import warm_up_plan
from stacx.inference.torch_engine import TorchEngine
from stacx.ports import SamplingParams

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)


def hf_greedy(engine: TorchEngine, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = engine.model.generate(  # type: ignore[operator]
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False
        )
    return out[0, len(prompt) :].tolist()


async def test_greedy_equals_transformers_generate_in_a_shared_batch(
    torch_engine, chat_prompt
) -> None:
    prompts = [chat_prompt(q) for q in ("What is 2+2?", "Write a haiku about the sea.", "Hi")]
    gens = await asyncio.gather(*(torch_engine.generate([p], GREEDY) for p in prompts))
    for prompt, (g,) in zip(prompts, gens, strict=True):
        assert g.output_ids == hf_greedy(torch_engine, prompt, 12)[: len(g.output_ids)]


async def test_next_turn_reuses_the_cached_prefix_and_stays_exact(
    torch_engine, chat_prompt
) -> None:
    first = chat_prompt("Name three animals.")
    (g1,) = await torch_engine.generate([first], GREEDY)
    second = first + g1.output_ids + chat_prompt("And three plants.")[1:]
    reused = torch_engine.stats["reused_tokens"]
    (g2,) = await torch_engine.generate([second], GREEDY)
    # everything but the last sampled token of turn 1 was already in the cache
    assert torch_engine.stats["reused_tokens"] - reused >= len(first) + len(g1.output_ids) - 1
    assert g2.output_ids == hf_greedy(torch_engine, second, 12)[: len(g2.output_ids)]


async def test_in_memory_state_dict_load_changes_outputs_and_version(
    torch_engine, chat_prompt
) -> None:
    prompt = chat_prompt("Describe the moon.")
    (before,) = await torch_engine.generate([prompt], GREEDY)
    norm = torch_engine.model.state_dict()["model.norm.weight"].clone()
    v = torch_engine.weight_version
    try:
        await torch_engine.load_state({"model.norm.weight": norm * 0.25}, v + 1)
        (after,) = await torch_engine.generate([prompt], GREEDY)
        assert after.weight_version == v + 1
        assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)
    finally:
        await torch_engine.load_state({"model.norm.weight": norm}, v + 2)


async def test_unknown_weight_name_is_refused_and_changes_nothing(torch_engine) -> None:
    v = torch_engine.weight_version
    with pytest.raises(EngineError, match="unknown parameter"):
        await torch_engine.load_state({"model.no_such.weight": torch.zeros(3)}, v + 1)
    assert torch_engine.weight_version == v


async def test_cancelled_request_frees_its_slot(torch_engine, chat_prompt) -> None:
    long = SamplingParams(max_new_tokens=2000, temperature=0.0, ignore_eos=True)
    steps = torch_engine.stats["decode_steps"]
    task = asyncio.create_task(torch_engine.generate([chat_prompt("Count forever.")], long))
    for _ in range(2400):  # until it is decoding (at most ~2 min on a loaded machine)
        if torch_engine.running and torch_engine.stats["decode_steps"] > steps:
            break
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (g,) = await torch_engine.generate([chat_prompt("Hi")], GREEDY)  # the engine still serves
    assert g.output_ids
    assert torch_engine.running == 0


async def test_a_stream_hands_over_each_step_and_equals_generate(torch_engine, chat_prompt) -> None:
    prompts = [chat_prompt("Name three colors."), chat_prompt("Describe the sea.")]
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=4)
    expected = await torch_engine.generate(prompts, params)
    deltas = [d async for d in torch_engine.generate_stream(prompts, params)]
    for i, gen in enumerate(expected):
        mine = [d for d in deltas if d.index == i]
        assert len(mine) > 1 and mine[-1].generation is not None  # step by step, then the whole
        assert (
            [t for d in mine for t in d.output_ids]
            == gen.output_ids
            == mine[-1].generation.output_ids
        )
        assert [v for d in mine for v in d.logprobs or []] == pytest.approx(gen.logprobs, abs=1e-4)
    assert [d.index for d in deltas][:2] == [0, 1]  # one batch: both prompts' first ids together


async def test_leaving_a_stream_early_frees_its_slot(torch_engine, chat_prompt) -> None:
    long = SamplingParams(max_new_tokens=2000, temperature=0.0, ignore_eos=True)
    stream = torch_engine.generate_stream([chat_prompt("Count forever.")], long)
    async for d in stream:
        assert d.generation is None and torch_engine.running == 1
        break
    await stream.aclose()
    for _ in range(2400):  # the worker aborts it at its next step
        if torch_engine.running == 0:
            break
        await asyncio.sleep(0.05)
    assert torch_engine.running == 0


async def test_seeded_sampling_reproduces_and_seeds_differ(torch_engine, chat_prompt) -> None:
    prompt = chat_prompt("Invent a word.")
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=7, ignore_eos=True)
    a, b = await torch_engine.generate([prompt, prompt], params)  # seeds 7 and 8
    (again,) = await torch_engine.generate([prompt], params)
    assert again.output_ids == a.output_ids
    assert a.output_ids != b.output_ids


def test_the_warm_up_plan_covers_every_prefill_piece_and_batch_bucket() -> None:
    """Short prompts at every batch bucket, and long ones where the bucket's decode graphs stop
    changing (`long_keys`: the Triton step's most key splits, 64 keys a tile over 8 kv heads)."""
    most_splits = lambda b: 64 * -(-1024 // (8 * b))  # noqa: E731 (most_splits_keys' rule)
    plan = warm_up_plan(48, 1200, 16, 500, pool_tokens=40_000, long_keys=most_splits)
    shapes = [(len(p), len(p[0]), params.max_new_tokens, params.temperature) for p, params in plan]
    prefills = [(1, n, 1, 0.0) for n in (32, 64, 128, 256, 512, 1024)]  # pieces up to max_len
    # long: to the context limit (1,199 less the 32 replied) for 1 to 4 rows, then 8,192 / rows
    long = {1: 1167, 2: 1167, 4: 1167, 8: 1024, 16: 512, 24: 384, 32: 256, 48: 192}
    decodes = [(b, n, 32, t) for b in long for n in (16, long[b]) for t in (0.0, 1.0)]
    assert shapes == prefills + decodes
    starts = [tuple(p[:4]) for prompts, _ in plan for p in prompts]
    assert len(set(starts)) == len(starts) == 546  # no prompt shares another's prefix: no reuse
    assert all(0 < t < 500 for prompts, _ in plan for p in prompts for t in p)
    # a paged pool smaller than the context limit bounds every row (else a prompt is refused),
    # and a long call's rows hold at most half of it
    small = warm_up_plan(8, 4096, 16, 500, pool_tokens=600, long_keys=most_splits)
    assert max(len(p[0]) + q.max_new_tokens for p, q in small) <= 300
    assert max(len(p) * (len(p[0]) + 32) for p, _ in small if len(p[0]) > 16) <= 300
    lengths = [len(p[0]) for p, _ in small]
    assert lengths[:8] == [32, 64, 128, 256, 16, 16, 267, 267]  # 300 - 32 replied - 1
    # the torch step (no long_keys): short prompts only
    assert {len(p[0]) for p, q in warm_up_plan(8, 4096, 16, 500) if q.max_new_tokens > 1} == {16}


async def test_a_warmed_up_engine_serves_as_a_fresh_one(model_dir, chat_prompt) -> None:
    """`warm_up` runs its plan through the engine, then leaves no cached prefix, hold or count
    behind: the next requests get the tokens and logprobs of an engine that never ran."""
    make = functools.partial(
        TorchEngine,
        model_dir,
        device="cpu",
        max_len=160,
        max_batch=4,
        decode_steps=2,
        threads=1,
        kv_cache="paged",
    )
    fresh, warmed = make(), make()
    try:
        plan = warm_up_plan(4, 160, 2, warmed.vocab_size, warmed.kv_usage()["pool_tokens"])
        done = await warmed.warm_up()
        assert done.requests == sum(len(p) for p, _ in plan)
        assert done.tokens == sum(len(p) * q.max_new_tokens for p, q in plan)
        assert set(warmed.stats.values()) == {0}
        assert warmed._holds.misses == 0 and warmed._holds.hold_s == fresh._holds.hold_s > 0
        assert warmed.kv_usage()["peak_tokens"] == fresh.kv_usage()["peak_tokens"]
        prompts = [chat_prompt("Name a colour."), plan[-1][0][0][:40]]  # one warm-up prefix too
        sampled = SamplingParams(max_new_tokens=6, temperature=1.0, seed=3, ignore_eos=True)
        for params in (GREEDY, sampled):
            a = await fresh.generate(prompts, params)
            b = await warmed.generate(prompts, params)
            assert [g.output_ids for g in a] == [g.output_ids for g in b]
            for x, y in zip(a, b, strict=True):
                assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)
        assert warmed.stats["reused_tokens"] == fresh.stats["reused_tokens"]
    finally:
        await fresh.close()
        await warmed.close()


async def test_prompt_beyond_context_limit_is_refused(torch_engine) -> None:
    with pytest.raises(EngineError, match="context limit"):
        await torch_engine.generate([[1] * torch_engine.max_len], GREEDY)


async def test_zero_new_tokens_returns_empty_length(torch_engine) -> None:
    (g,) = await torch_engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=0))
    assert g.output_ids == [] and g.finish_reason == "length"


def _small(model_type: str) -> torch.nn.Module:
    import transformers

    shape = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        vocab_size=300,
        max_position_embeddings=128,
    )
    cfg = {
        "llama": lambda: transformers.LlamaConfig(**shape),
        "qwen2": lambda: transformers.Qwen2Config(**shape),  # q/k/v biases
        "qwen3": lambda: transformers.Qwen3Config(**shape, head_dim=16),  # q/k norms
    }[model_type]()
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).float().eval()


def _logits(decoder: Decoder, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill logits of every prompt token, then one decode step's logits for every row."""
    cache = decoder.new_cache()
    cache.grow(len(prompts), 64)
    pre = decoder.prefill(
        cache, list(range(len(prompts))), [0] * len(prompts), prompts, [0] * len(prompts)
    )
    ids = torch.tensor([p[-1] for p in prompts])
    pos = torch.tensor([len(p) for p in prompts])
    step = decoder.decode(cache, ids, pos, int(pos.max()) + 1)
    return torch.cat(pre), step


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_fused_projections_equal_unfused_and_follow_in_place_loads(model_type: str) -> None:
    """One GEMM for q/k/v and one for gate/up computes what the separate projections do, the
    model's parameters become views of the fused weights (same values), and an in-place load
    into the model (as `load_state` does) reaches the fused path."""
    fused_model, plain_model = _small(model_type), _small(model_type)
    before = {k: v.clone() for k, v in fused_model.state_dict().items()}
    fused, plain = Decoder(fused_model, 64), Decoder(plain_model, 64, fuse=False)
    assert all(f is not None for f in fused.fused_qkv + fused.fused_gate_up)
    assert plain.fused_qkv == [None, None]
    attn = fused.layers[0].self_attn
    assert attn.q_proj.weight.data_ptr() == fused.fused_qkv[0].weight.data_ptr()
    assert (attn.q_proj.bias is not None) == (model_type == "qwen2")
    for k, v in fused_model.state_dict().items():
        assert torch.equal(v, before[k]), k
    prompts = [[5, 17, 42, 7, 99], [3, 250, 11]]
    for a, b in zip(_logits(fused, prompts), _logits(plain, prompts), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch.manual_seed(1)
    new = {k: torch.randn_like(v) * 0.05 for k, v in before.items() if "proj" in k}
    with torch.no_grad():
        fused_model.load_state_dict(new, strict=False)
        plain_model.load_state_dict(new, strict=False)
    after_f, after_p = _logits(fused, prompts), _logits(plain, prompts)
    torch.testing.assert_close(after_f[1], after_p[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(after_f[0], after_p[0], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(after_f[1], _logits(Decoder(_small(model_type), 64), prompts)[1])


def test_reduction_gemv_decode_equals_gemm_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    """The multiply-and-sum projections that small compiled decode steps use (`gemv_rows`)
    compute the same logits as F.linear (run eagerly here, as if compiling: shapes are tiny)."""
    model = _small("qwen2")
    dec = Decoder(model, 64)
    prompts = [[5, 17, 42, 7, 99], [3, 250, 11]]
    _, gemm = _logits(dec, prompts)
    dec.gemv_rows = 2
    assert torch.equal(_logits(dec, prompts)[1], gemm)  # eager: never the reduction form
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    _, gemv = _logits(dec, prompts)
    assert not torch.equal(gemv, gemm)  # another summation order: it did run
    torch.testing.assert_close(gemv, gemm, rtol=1e-5, atol=1e-5)
    dec.gemv_rows = 1  # 2 rows > 1: the GEMM path again, bit for bit
    assert torch.equal(_logits(dec, prompts)[1], gemm)

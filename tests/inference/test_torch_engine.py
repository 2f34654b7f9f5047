"""Properties of the in-process engine beyond the shared contract: exactness against
transformers, prefix reuse, in-memory weight loads, cancellation, seeded sampling."""

from __future__ import annotations

import asyncio

import pytest
import torch

from stacx.errors import EngineError
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


async def test_seeded_sampling_reproduces_and_seeds_differ(torch_engine, chat_prompt) -> None:
    prompt = chat_prompt("Invent a word.")
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=7, ignore_eos=True)
    a, b = await torch_engine.generate([prompt, prompt], params)  # seeds 7 and 8
    (again,) = await torch_engine.generate([prompt], params)
    assert again.output_ids == a.output_ids
    assert a.output_ids != b.output_ids


async def test_prompt_beyond_context_limit_is_refused(torch_engine) -> None:
    with pytest.raises(EngineError, match="context limit"):
        await torch_engine.generate([[1] * torch_engine.max_len], GREEDY)


async def test_zero_new_tokens_returns_empty_length(torch_engine) -> None:
    (g,) = await torch_engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=0))
    assert g.output_ids == [] and g.finish_reason == "length"

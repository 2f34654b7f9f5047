"""The Engine contract, run against every backend: the in-process torch engine, the SGLang
client against a real `stacx serve` subprocess, and the OpenAI client against the same server.

Each test states one property a caller relies on (rollouts, GRPO, OPD, weight publishing).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from safetensors.torch import save_file

from stacx.errors import EngineError
from stacx.inference.openai_client import OpenAIEngine
from stacx.inference.sglang_client import SGLangEngine
from stacx.inference.torch_engine import TorchEngine
from stacx.ports import Engine, SamplingParams

BACKENDS = ["torch", "sglang", "openai"]
GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)


@pytest.fixture(params=BACKENDS)
async def engine(request: pytest.FixtureRequest) -> AsyncIterator[Engine]:
    if request.param == "torch":
        yield request.getfixturevalue("torch_engine")
        return
    url = request.getfixturevalue("serve_url")
    client: Engine = (
        SGLangEngine(url) if request.param == "sglang" else OpenAIEngine(url, "default")
    )
    yield client
    await client.close()


async def test_is_an_engine(engine: Engine) -> None:
    assert isinstance(engine, Engine)


async def test_one_logprob_per_output_id(engine: Engine, chat_prompt) -> None:
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=1)
    gens = await engine.generate(
        [chat_prompt("Name a fruit."), chat_prompt("Count to three.")], params
    )
    assert len(gens) == 2
    for g in gens:
        assert 1 <= len(g.output_ids) <= 6
        assert g.logprobs is not None and len(g.logprobs) == len(g.output_ids)
        assert all(lp <= 0.0 for lp in g.logprobs)
        assert isinstance(g.weight_version, int)


async def test_length_finish_when_max_new_tokens_reached(engine: Engine, chat_prompt) -> None:
    params = SamplingParams(max_new_tokens=5, temperature=0.0, ignore_eos=True)
    (g,) = await engine.generate([chat_prompt("Tell me a long story.")], params)
    assert len(g.output_ids) == 5
    assert g.finish_reason == "length"


async def test_eos_stops_and_is_returned(
    engine: Engine, chat_prompt, torch_engine: TorchEngine
) -> None:
    # SmolLM2 answers "Hi" with one short sentence, then <|im_end|>
    (g,) = await engine.generate(
        [chat_prompt("Hi")], SamplingParams(max_new_tokens=40, temperature=0.0)
    )
    assert g.finish_reason == "stop"
    assert g.output_ids[-1] in torch_engine.eos_ids


async def test_stop_token_id_ends_generation(engine: Engine, chat_prompt) -> None:
    prompt = chat_prompt("Write a poem about rivers.")
    (free,) = await engine.generate([prompt], GREEDY)
    stop = free.output_ids[3]
    cut = free.output_ids.index(stop) + 1  # the first occurrence ends it
    params = SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=[stop])
    (g,) = await engine.generate([prompt], params)
    assert g.finish_reason == "stop"
    assert g.output_ids == free.output_ids[:cut]


async def test_greedy_is_deterministic_and_batch_independent(engine: Engine, chat_prompt) -> None:
    prompt = chat_prompt("What is the capital of France?")
    (alone,) = await engine.generate([prompt], GREEDY)
    again, _, _ = await engine.generate(
        [prompt, chat_prompt("Say something."), chat_prompt("Why is the sky blue?")], GREEDY
    )
    assert again.output_ids == alone.output_ids


async def test_concurrent_requests_are_all_answered(engine: Engine, chat_prompt) -> None:
    prompts = [chat_prompt(f"Give me a number bigger than {i}.") for i in range(10)]
    params = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
    results = await asyncio.gather(*(engine.generate([p], params) for p in prompts))
    sequential = [(await engine.generate([p], params))[0] for p in prompts[:3]]
    assert all(len(r) == 1 and len(r[0].output_ids) == 4 for r in results)
    assert [r[0].output_ids for r in results[:3]] == [s.output_ids for s in sequential]


async def test_score_agrees_with_generation_logprobs(engine: Engine, chat_prompt) -> None:
    prompt = chat_prompt("Describe a cat.")
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=3)
    (g,) = await engine.generate([prompt], params)
    scored = await engine.score(prompt, g.output_ids)
    assert scored == pytest.approx(g.logprobs, abs=2e-3)


async def test_out_of_range_token_is_an_engine_error(engine: Engine) -> None:
    with pytest.raises(EngineError):
        await engine.generate([[10**7]], GREEDY)


async def test_weight_load_bumps_version_of_later_generations(
    engine: Engine, chat_prompt, torch_engine: TorchEngine, tmp_path: Path
) -> None:
    norm = torch_engine.model.state_dict()["model.norm.weight"].detach().clone()
    perturbed, original = tmp_path / "perturbed.safetensors", tmp_path / "original.safetensors"
    save_file({"model.norm.weight": norm * 0.5}, str(perturbed))
    save_file({"model.norm.weight": norm}, str(original))
    prompt = chat_prompt("Describe a dog.")
    (before,) = await engine.generate([prompt], GREEDY)
    v = engine.weight_version
    if isinstance(engine, OpenAIEngine):
        with pytest.raises(EngineError):  # a remote teacher's weights are not ours to load
            await engine.load_weights(str(perturbed), v + 1)
        return
    try:
        await engine.load_weights(str(perturbed), v + 1)
        (after,) = await engine.generate([prompt], GREEDY)
        assert engine.weight_version == v + 1
        assert before.weight_version == v and after.weight_version == v + 1
        assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)  # new weights are used
    finally:
        await engine.load_weights(str(original), v + 2)
    (restored,) = await engine.generate([prompt], GREEDY)
    assert restored.weight_version == v + 2
    assert restored.output_ids == before.output_ids

"""`stacx serve` over raw HTTP: SGLang's response shapes, OpenAI routes, clear 400s."""

from __future__ import annotations

import aiohttp
import pytest


async def post(url: str, path: str, body: object) -> tuple[int, object]:
    async with aiohttp.ClientSession() as s, s.post(url + path, json=body) as r:
        data = await r.json() if r.content_type == "application/json" else await r.text()
        return r.status, data


async def get(url: str, path: str) -> tuple[int, object]:
    async with aiohttp.ClientSession() as s, s.get(url + path) as r:
        data = await r.json() if r.content_type == "application/json" else await r.text()
        return r.status, data


async def test_generate_answers_in_sglang_shape(serve_url: str, chat_prompt) -> None:
    body = {
        "input_ids": chat_prompt("Hi"),
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True},
    }
    status, out = await post(serve_url, "/generate", body)
    assert status == 200 and isinstance(out, dict)
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 3}
    assert meta["completion_tokens"] == 3 and meta["prompt_tokens"] == len(body["input_ids"])
    assert isinstance(meta["weight_version"], str)
    triples = meta["output_token_logprobs"]
    assert [t[1] for t in triples] == out["output_ids"] and all(t[0] <= 0 for t in triples)
    assert isinstance(out["text"], str)


async def test_generate_batch_returns_a_list_and_input_logprobs(serve_url: str) -> None:
    body = {
        "input_ids": [[1, 2, 3, 4], [5, 6, 7]],
        "return_logprob": True,
        "logprob_start_len": 0,
        "sampling_params": {"max_new_tokens": 2, "temperature": 0},
    }
    status, out = await post(serve_url, "/generate", body)
    assert status == 200 and isinstance(out, list) and len(out) == 2
    first = out[0]["meta_info"]["input_token_logprobs"]
    assert [t[1] for t in first] == [1, 2, 3, 4]
    assert first[0][0] is None and all(t[0] <= 0 for t in first[1:])


async def test_unknown_sampling_param_is_a_400_naming_it(serve_url: str) -> None:
    body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokns": 2}}
    status, out = await post(serve_url, "/generate", body)
    assert status == 400 and "max_new_tokns" in str(out)


async def test_non_integer_weight_version_is_a_400(serve_url: str) -> None:
    status, out = await post(
        serve_url,
        "/update_weights_from_disk",
        {"model_path": "/nonexistent", "weight_version": "v2"},
    )
    assert status == 400 and "weight_version" in str(out)


async def test_missing_weights_file_is_refused_with_its_path(serve_url: str) -> None:
    status, out = await post(
        serve_url,
        "/update_weights_from_disk",
        {"model_path": "/nonexistent/x.safetensors", "weight_version": "5"},
    )
    assert status == 400 and isinstance(out, dict) and out["success"] is False
    assert "/nonexistent/x.safetensors" in out["message"]


async def test_chat_completions_uses_the_chat_template(serve_url: str, chat_prompt) -> None:
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": True,
        "return_token_ids": True,
    }
    status, out = await post(serve_url, "/v1/chat/completions", body)
    assert status == 200 and isinstance(out, dict)
    choice = out["choices"][0]
    assert choice["prompt_token_ids"] == chat_prompt("Hi")
    assert isinstance(choice["message"]["content"], str)
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"]) <= 4


async def test_completions_with_text_prompt_and_logprobs(serve_url: str) -> None:
    body = {
        "model": "default",
        "prompt": "The capital of France is",
        "max_tokens": 3,
        "temperature": 0,
        "logprobs": 1,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
    }
    status, out = await post(serve_url, "/v1/completions", body)
    assert status == 200 and isinstance(out, dict)
    lp = out["choices"][0]["logprobs"]
    ids = out["choices"][0]["token_ids"]
    assert lp["tokens"] == [f"token_id:{t}" for t in ids]
    assert len(lp["token_logprobs"]) == len(ids) and out["usage"]["completion_tokens"] == len(ids)


@pytest.mark.parametrize("path", ["/health", "/get_model_info", "/v1/models"])
async def test_info_routes_answer(serve_url: str, path: str) -> None:
    status, _ = await get(serve_url, path)
    assert status == 200


async def test_flush_cache(serve_url: str) -> None:
    status, _ = await post(serve_url, "/flush_cache", {})
    assert status == 200


async def test_a_grammar_travels_as_ebnf_and_the_reply_follows_it(
    serve_url: str, chat_prompt
) -> None:
    """The engine role's client (placement processes) constrains through the server: the
    gateway's forced tool calls keep their schema when the engine is in another process."""
    import json

    from stacx.errors import EngineError
    from stacx.inference.chat_template import json_grammar
    from stacx.inference.sglang_client import SGLangEngine
    from stacx.ports import SamplingParams

    schema = {
        "type": "object",
        "properties": {
            "city": {"enum": ["Paris", "Rome"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 9},
        },
        "required": ["city", "days"],
        "additionalProperties": False,
    }
    params = SamplingParams(
        max_new_tokens=48, temperature=1.0, seed=3, grammar=json_grammar(schema)
    )
    prompt = chat_prompt("Where and for how long?")
    client = SGLangEngine(serve_url, grammars=True)
    try:
        [gen] = await client.generate([prompt], params)
        text = chat_prompt.tok.decode(gen.output_ids, skip_special_tokens=True)
        value = json.loads(text)
        assert value["city"] in ("Paris", "Rome") and 1 <= value["days"] <= 9
    finally:
        await client.close()
    plain = SGLangEngine(serve_url)  # a server not known to read the grammar: refused, not dropped
    try:
        with pytest.raises(EngineError, match="llguidance"):
            await plain.generate([prompt], params)
    finally:
        await plain.close()

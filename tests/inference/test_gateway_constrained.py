"""Constrained decoding through the gateway, with the official `openai` client against `stacx
serve` (SmolLM2, the torch engine, llguidance): `tool_choice` "required" and named return a call
whose arguments validate against the tool's JSON schema, at temperature 1 too, every time;
`response_format` json_schema and json_object return parseable JSON (the schema's)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.model

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a bash command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "maxLength": 40}},
            "required": ["command"],
            "additionalProperties": False,
        },
    },
}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, BASH)}


@pytest.fixture
async def client(serve_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    c = openai.AsyncOpenAI(base_url=serve_url + "/v1", api_key="none", max_retries=0)
    yield c
    await c.close()


async def test_required_at_temperature_1_returns_a_schema_valid_call_every_time(
    client: openai.AsyncOpenAI,
) -> None:
    names = []
    for seed in range(8):  # eight sampled replies, each under the grammar
        r = await client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "Will it rain in Rome this week?"}],
            tools=[WEATHER, BASH],
            tool_choice="required",
            temperature=1.0,
            seed=seed,
            max_tokens=64,
        )
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", (seed, choice.message.content)
        (call,) = choice.message.tool_calls or []
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        names.append(call.function.name)
    assert set(names) <= set(SCHEMAS)


async def test_a_named_function_gets_arguments_under_its_schema(client: openai.AsyncOpenAI) -> None:
    r = await client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "List the files."}],
        tools=[WEATHER, BASH],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=1.0,
        seed=7,
        max_tokens=64,
    )
    (call,) = r.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS["get_weather"])


async def test_response_format_json_schema_returns_json_of_that_schema(
    client: openai.AsyncOpenAI,
) -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    for seed in range(3):
        r = await client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "Describe a person as JSON."}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": schema},
            },
            temperature=1.0,
            seed=seed,
            max_tokens=64,
        )
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content or ""), schema)
    r = await client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": 'Reply {"greeting": "hi"} as JSON.'}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=200,
    )
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert isinstance(json.loads(r.choices[0].message.content or ""), dict)


async def test_a_bad_response_format_names_the_accepted_ones(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "Hi"}],
            response_format={"type": "yaml"},  # type: ignore[typeddict-item]
        )
    body = info.value.body
    assert (
        isinstance(body, dict)
        and body["param"] == "response_format"
        and "json_schema" in body["message"]
    )

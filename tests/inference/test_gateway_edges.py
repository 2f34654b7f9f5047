"""The gateway's OpenAI edges with the official `openai` client and the real SmolLM2 model:
unknown model names (404 model_not_found), `models.retrieve`, `tool_choice` "required" (of one
tool or of several) and a named function (honoured by prefilling the tool-call opening and decoding
the arguments under the tool's schema: tests/inference/test_gateway_constrained.py), and the
error answers to an episode's calls recorded as `GatewayRefused`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import openai
import pytest

from stacx.events import Event, GatewayRefused, TurnGenerated
from stacx.inference.gateway import Gateway, serve_tcp
from stacx.inference.torch_engine import TorchEngine

pytestmark = pytest.mark.model

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a bash command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
READ = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
}
LIST_FILES = "Run ls."


@pytest.fixture
async def client(serve_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    c = openai.AsyncOpenAI(base_url=serve_url + "/v1", api_key="none", max_retries=0)
    yield c
    await c.close()


async def test_unknown_model_is_404_model_not_found(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        await client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
    assert info.value.code == "model_not_found" and info.value.status_code == 404
    assert "gpt-4o" in info.value.message
    with pytest.raises(openai.NotFoundError) as info:
        await client.completions.create(model="gpt-3.5-turbo-instruct", prompt="a", max_tokens=2)
    assert info.value.code == "model_not_found"


async def test_served_name_and_aliases_answer(client: openai.AsyncOpenAI, model_dir: str) -> None:
    listed = [m.id async for m in client.models.list()]
    # --model, the --model-alias names, and the checkpoint's directory name
    assert {model_dir, "default", "student", "smollm2-135m-instruct"} <= set(listed)
    for name in ("student", "smollm2-135m-instruct"):
        r = await client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
        assert r.model == name
    card = await client.models.retrieve("student")
    assert card.id == "student" and card.object == "model"
    with pytest.raises(openai.NotFoundError) as info:
        await client.models.retrieve("gpt-4o")
    assert info.value.code == "model_not_found"


async def test_tool_choice_required_gives_a_tool_call(client: openai.AsyncOpenAI) -> None:
    r = await client.chat.completions.create(
        model="student",
        messages=[{"role": "user", "content": LIST_FILES}],
        tools=[BASH],
        tool_choice="required",
        temperature=0,
        max_tokens=64,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "bash"
    assert isinstance(json.loads(call.function.arguments), dict)


async def test_required_of_several_tools_calls_the_likeliest(
    client: openai.AsyncOpenAI, torch_engine: TorchEngine
) -> None:
    # left to itself after `<tool_call>{"name": "`, the model names the function "ls" here; the
    # gateway prefills the call of the tool the model scores likeliest (bash, listed second),
    # up to its arguments (the model's, under the tool's schema)
    r = await client.chat.completions.create(
        model="student",
        messages=[{"role": "user", "content": LIST_FILES}],
        tools=[READ, BASH],
        tool_choice="required",
        temperature=0,
        max_tokens=64,
        extra_body={"return_token_ids": True},
    )
    choice = r.choices[0]
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "bash" and choice.finish_reason == "tool_calls"
    assert isinstance(json.loads(call.function.arguments), dict)
    prompt = torch_engine.tokenizer.decode(choice.prompt_token_ids)  # type: ignore[attr-defined]
    assert prompt.endswith('<tool_call>{"name": "bash", "arguments":')


async def test_named_tool_choice_calls_that_function(client: openai.AsyncOpenAI) -> None:
    # the model, left to itself, calls bash here (test above); the named choice forces read_file
    body = {
        "model": "student",
        "messages": [{"role": "user", "content": LIST_FILES}],
        "tools": [BASH, READ],
        "temperature": 0,
        "max_tokens": 64,
        "tool_choice": {"type": "function", "function": {"name": "read_file"}},
    }
    r = await client.chat.completions.create(**body)
    (call,) = r.choices[0].message.tool_calls or []
    assert call.function.name == "read_file" and r.choices[0].finish_reason == "tool_calls"
    # streamed: no text of the call leaks as content; the call comes whole, the same one
    chunks = [c async for c in await client.chat.completions.create(**body, stream=True)]
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    streamed = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert [(t.function.name, t.function.arguments) for t in streamed] == [
        (call.function.name, call.function.arguments)
    ]


async def test_bad_tool_choice_names_the_accepted_ones(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(
            model="student",
            messages=[{"role": "user", "content": "Hi"}],
            tools=[BASH],
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == "tool_choice" and "bash" in body["message"]


class Recorded:
    def __init__(self) -> None:
        self.events: list[Event] = []

    async def emit(self, event: Event) -> None:
        self.events.append(event)


async def test_an_episode_records_prefill_and_refusals(torch_engine: TorchEngine) -> None:
    gateway = Gateway(torch_engine, torch_engine.tokenizer, model_name="student", max_len=2048)  # type: ignore[arg-type]
    rec = Recorded()
    async with (
        serve_tcp(gateway) as url,
        gateway.episode(run_id="r", episode_id="ep", emit=rec.emit) as ep,
    ):
        client = openai.AsyncOpenAI(base_url=url, api_key=ep.credential, max_retries=0)
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(
                model="openai/student", messages=[{"role": "user", "content": "Hi"}]
            )
        r = await client.chat.completions.create(
            model="student",
            messages=[{"role": "user", "content": LIST_FILES}],
            tools=[BASH],
            tool_choice={"type": "function", "function": {"name": "bash"}},
            temperature=0,
            max_tokens=64,
            extra_body={"return_token_ids": True},
        )
        await client.close()
    refused, turn = rec.events
    assert isinstance(refused, GatewayRefused) and refused.episode_id == "ep"
    assert (refused.status, refused.code, refused.param) == (404, "model_not_found", "model")
    assert refused.route == "/v1/chat/completions" and "openai/student" in refused.message
    # the prefill is part of the prompt the engine saw; the output is the model's own ids
    assert isinstance(turn, TurnGenerated)
    prompt = torch_engine.tokenizer.decode(turn.prompt_ids)  # type: ignore[union-attr]
    assert prompt.endswith('<tool_call>{"name": "bash", "arguments":')
    assert json.loads(turn.request_json)["tool_choice"] == {  # why the prompt ends so
        "type": "function",
        "function": {"name": "bash"},
    }
    assert r.choices[0].token_ids == turn.output_ids  # type: ignore[attr-defined]
    assert r.choices[0].message.tool_calls


async def test_max_tokens_beyond_the_context_is_a_400_naming_both_numbers(
    client: openai.AsyncOpenAI,
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(
            model="student", messages=[{"role": "user", "content": "Hi"}], max_tokens=100000
        )
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == "max_tokens"
    assert body["code"] == "context_length_exceeded"
    assert "100000" in body["message"] and "context of 2048 tokens" in body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        await client.completions.create(model="student", prompt="a", max_tokens=100000)
    assert "100000" in info.value.message


async def test_completion_ids_and_token_ids_only_when_asked(client: openai.AsyncOpenAI) -> None:
    text = await client.completions.create(model="student", prompt="The sky is", max_tokens=3)
    chat = await client.chat.completions.create(
        model="student", messages=[{"role": "user", "content": "Hi"}], max_tokens=3
    )
    assert text.id.startswith("cmpl-") and chat.id.startswith("chatcmpl-")
    for choice in (text.choices[0], chat.choices[0]):  # vLLM's extension, unasked: absent
        assert (
            "token_ids" not in choice.model_dump() and "prompt_token_ids" not in choice.model_dump()
        )
    asked = await client.completions.create(
        model="student", prompt="The sky is", max_tokens=3, extra_body={"return_token_ids": True}
    )
    choice = asked.choices[0].model_dump()
    assert len(choice["token_ids"]) == asked.usage.completion_tokens  # type: ignore[union-attr]
    assert len(choice["prompt_token_ids"]) == asked.usage.prompt_tokens  # type: ignore[union-attr]
    chunks = [
        c
        async for c in await client.chat.completions.create(
            model="student", messages=[{"role": "user", "content": "Hi"}], max_tokens=3, stream=True
        )
    ]
    assert not [c for c in chunks if c.choices and "token_ids" in c.choices[0].model_dump()]

"""Anthropic's Messages API on the gateway with the official `anthropic` client and the real
SmolLM2 model: a plain message (the same reply as the chat route), system prompts, a tool round
trip (recorded as one extending token sequence), streaming with Anthropic's event types, stop
sequences, and Anthropic-shaped errors."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import anthropic
import openai
import pytest

from stacx.events import Event, GatewayRefused, TurnGenerated
from stacx.inference.gateway import Gateway, GatewayEpisode, serve_tcp
from stacx.inference.torch_engine import TorchEngine

pytestmark = pytest.mark.model

BASH = {
    "name": "bash",
    "description": "Run a bash command",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}
HI = [{"role": "user", "content": "Hi"}]
COPY_CALL = (
    "Reply with exactly this text and nothing else: "
    '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'
)
T0 = {"temperature": 0}  # greedy; the current client has no temperature argument, older ones do


class Recorded:
    def __init__(self) -> None:
        self.turns: list[TurnGenerated] = []
        self.refused: list[GatewayRefused] = []

    async def emit(self, event: Event) -> None:
        if isinstance(event, GatewayRefused):
            self.refused.append(event)
        else:
            assert isinstance(event, TurnGenerated)
            self.turns.append(event)


@pytest.fixture
async def client(serve_url: str) -> AsyncIterator[anthropic.AsyncAnthropic]:
    c = anthropic.AsyncAnthropic(base_url=serve_url, api_key="none", max_retries=0)
    yield c
    await c.close()


@pytest.fixture
async def episode(
    torch_engine: TorchEngine,
) -> AsyncIterator[tuple[anthropic.AsyncAnthropic, GatewayEpisode, Recorded, str]]:
    gateway = Gateway(torch_engine, torch_engine.tokenizer, model_name="student", max_len=2048)  # type: ignore[arg-type]
    rec = Recorded()
    async with (
        serve_tcp(gateway) as url,
        gateway.episode(run_id="r", episode_id="ep", emit=rec.emit) as ep,
    ):
        root = url.removesuffix("/v1")
        c = anthropic.AsyncAnthropic(base_url=root, api_key=ep.credential, max_retries=0)
        yield c, ep, rec, url
        await c.close()


async def test_a_message_is_the_chat_routes_reply(client, serve_url: str) -> None:
    msg = await client.messages.create(model="student", max_tokens=12, messages=HI, extra_body=T0)
    oa = openai.AsyncOpenAI(base_url=serve_url + "/v1", api_key="none", max_retries=0)
    chat = await oa.chat.completions.create(
        model="student", max_tokens=12, messages=HI, temperature=0
    )
    await oa.close()
    assert msg.type == "message" and msg.role == "assistant" and msg.model == "student"
    (block,) = msg.content
    assert block.type == "text" and block.text == chat.choices[0].message.content
    assert msg.usage.input_tokens == chat.usage.prompt_tokens  # type: ignore[union-attr]
    assert msg.usage.output_tokens == chat.usage.completion_tokens  # type: ignore[union-attr]
    assert msg.stop_reason == (
        "max_tokens" if chat.choices[0].finish_reason == "length" else "end_turn"
    )


async def test_system_prompt_as_string_or_blocks(episode, torch_engine) -> None:
    client, _, rec, _ = episode
    system = "You are terse."
    await client.messages.create(model="student", max_tokens=2, system=system, messages=HI)
    await client.messages.create(
        model="student",
        max_tokens=2,
        messages=HI,
        system=[
            {"type": "text", "text": "You are ", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "terse."},
        ],
    )
    first, second = rec.turns
    tok = torch_engine.tokenizer
    text = tok.apply_chat_template(
        [{"role": "system", "content": system}, *HI], tokenize=False, add_generation_prompt=True
    )
    assert first.prompt_ids == tok.encode(text, add_special_tokens=False)
    # the second prompt is the same text: stored as a new segment of the same ids
    assert second.prefix_len == 0 and second.prompt_ids == first.prompt_ids
    assert second.segment == first.segment + 1


async def test_a_tool_round_trip_extends_the_token_sequence(episode) -> None:
    client, _, rec, _ = episode
    messages: list[dict[str, object]] = [{"role": "user", "content": COPY_CALL}]
    first = await client.messages.create(
        model="student", max_tokens=40, extra_body=T0, messages=messages, tools=[BASH]
    )
    assert first.stop_reason == "tool_use"
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "bash" and use.input == {"command": "ls"}
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.txt"}],
        },
    ]
    await client.messages.create(model="student", max_tokens=4, messages=messages, tools=[BASH])
    one, two = rec.turns
    assert two.prefix_len == len(one.prompt_ids) + len(one.output_ids)
    assert two.segment == one.segment == 0


async def test_streaming_sends_anthropics_events(client) -> None:
    body = {"model": "student", "max_tokens": 12, "messages": HI, "extra_body": T0}
    whole = await client.messages.create(**body)
    events = [e async for e in await client.messages.create(**body, stream=True)]
    kinds = [e.type for e in events]  # the client drops pings (checked on the wire below)
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds[1] == "content_block_start" and "content_block_stop" in kinds
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == whole.content[0].text  # type: ignore[union-attr]
    delta = events[-2]
    assert delta.delta.stop_reason == whole.stop_reason  # type: ignore[union-attr]
    assert delta.usage.output_tokens == whole.usage.output_tokens  # type: ignore[union-attr]
    async with client.messages.stream(**body) as stream:  # the client's helper agrees
        assert "".join([t async for t in stream.text_stream]) == text
        final = await stream.get_final_message()
    assert final.content[0].text == text  # type: ignore[union-attr]


async def test_the_wire_has_anthropics_sse_events(serve_url: str) -> None:
    body = {"model": "student", "max_tokens": 4, "messages": HI, "stream": True}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{serve_url}/v1/messages", json=body) as resp,
    ):
        assert resp.content_type == "text/event-stream"
        raw = (await resp.read()).decode()
    names = [line[7:] for line in raw.splitlines() if line.startswith("event: ")]
    datas = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
    assert names == [d["type"] for d in datas]  # each event's name is its data's type
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]


async def test_a_streamed_tool_use_arrives_as_input_json(client) -> None:
    events = [
        e
        async for e in await client.messages.create(
            model="student",
            max_tokens=64,
            extra_body=T0,
            stream=True,
            tools=[BASH],
            messages=[{"role": "user", "content": "Run ls."}],
            tool_choice={"type": "any"},
        )
    ]
    starts = [e.content_block for e in events if e.type == "content_block_start"]
    assert [b.type for b in starts] == ["tool_use"] and starts[0].name == "bash"  # type: ignore[union-attr]
    assert any(
        e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in events
    )
    assert events[-2].delta.stop_reason == "tool_use"  # type: ignore[union-attr]


async def test_stop_sequences_end_the_reply(client) -> None:
    body = {"model": "student", "max_tokens": 16, "messages": HI, "extra_body": T0}
    full = (await client.messages.create(**body)).content[0].text  # type: ignore[union-attr]
    stop = full.split()[1]  # a word the reply writes (not its first)
    cut = await client.messages.create(**body, stop_sequences=["zzzq", stop])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == full[: full.index(stop)]  # type: ignore[union-attr]


async def test_errors_are_anthropic_shaped_and_recorded(episode) -> None:
    client, _, rec, _ = episode
    with pytest.raises(anthropic.NotFoundError) as nf:
        await client.messages.create(model="claude-sonnet-4-5", max_tokens=4, messages=HI)
    assert nf.value.body["type"] == "error"  # type: ignore[index]
    assert nf.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert "claude-sonnet-4-5" in nf.value.body["error"]["message"]  # type: ignore[index]
    bad = [{"role": "user", "content": [{"type": "image", "source": {}}]}]
    with pytest.raises(anthropic.BadRequestError) as br:
        await client.messages.create(model="student", max_tokens=4, messages=bad)
    err = br.value.body["error"]  # type: ignore[index]
    assert err["type"] == "invalid_request_error" and "messages.0.content.0" in err["message"]
    with pytest.raises(anthropic.BadRequestError) as br:
        await client.messages.create(
            model="student", max_tokens=4, messages=HI, extra_body={"temprature": 0.5}
        )
    assert "temprature" in br.value.body["error"]["message"]  # type: ignore[index]
    assert not rec.turns
    assert [(r.status, r.route) for r in rec.refused] == [(404, "/v1/messages")] + [
        (400, "/v1/messages")
    ] * 2

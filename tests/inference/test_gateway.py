"""The model gateway with the official `openai` client and the real SmolLM2 engine: tools,
streaming, n > 1, stop strings, OpenAI-shaped 400s naming the field, and the recorded turns
(exact template ids, the engine's own output ids, segments)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest

from stacx.events import Event, GatewayRefused, TurnGenerated
from stacx.inference.gateway import Gateway, GatewayEpisode, serve_tcp
from stacx.inference.torch_engine import TorchEngine
from stacx.ports import SamplingParams

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
COPY_CALL = (
    "Reply with exactly this text and nothing else: "
    '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'
)


class Recorded:
    def __init__(self) -> None:
        self.turns: list[TurnGenerated] = []
        self.refused: list[GatewayRefused] = []

    async def emit(self, event: Event) -> None:
        if isinstance(event, GatewayRefused):
            self.refused.append(event)
            return
        assert isinstance(event, TurnGenerated)
        self.turns.append(event)


@pytest.fixture
async def served(torch_engine: TorchEngine) -> AsyncIterator[tuple[Gateway, str]]:
    gateway = Gateway(torch_engine, torch_engine.tokenizer, model_name="student", max_len=2048)  # type: ignore[arg-type]
    async with serve_tcp(gateway) as url:
        yield gateway, url


@pytest.fixture
async def episode(
    served: tuple[Gateway, str],
) -> AsyncIterator[tuple[openai.AsyncOpenAI, GatewayEpisode, Recorded]]:
    gateway, url = served
    rec = Recorded()
    async with gateway.episode(run_id="r", episode_id="ep", emit=rec.emit) as ep:
        client = openai.AsyncOpenAI(base_url=url, api_key=ep.credential, max_retries=0)
        yield client, ep, rec
        await client.close()


async def test_tool_call_in_the_reply_comes_back_as_tool_calls(episode, torch_engine) -> None:
    client, _, rec = episode
    r = await client.chat.completions.create(
        model="student",
        messages=[{"role": "user", "content": COPY_CALL}],
        tools=[BASH],
        temperature=0,
        max_tokens=40,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "bash" and json.loads(call.function.arguments) == {"command": "ls"}
    # the schema reached the model: SmolLM2's template has no tools, so the gateway wrote them
    prompt = torch_engine.tokenizer.decode(rec.turns[0].prompt_ids)  # type: ignore[union-attr]
    assert "<tools>" in prompt and '"name": "bash"' in prompt


async def test_a_tool_round_trip_extends_the_token_sequence_exactly(episode, torch_engine) -> None:
    client, _, rec = episode
    messages = [{"role": "user", "content": COPY_CALL}]
    r = await client.chat.completions.create(
        model="student", messages=messages, tools=[BASH], temperature=0, max_tokens=40
    )
    msg = r.choices[0].message
    assert msg.tool_calls
    messages += [
        msg.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "a.txt"},
    ]
    await client.chat.completions.create(
        model="student", messages=messages, tools=[BASH], temperature=0, max_tokens=8
    )
    first, second = rec.turns
    # the assistant message is rendered as the model's own text: prompt 2 extends prompt 1 +
    # output 1, so it is stored linearly (that prefix's length and the new ids only)
    assert first.prefix_len == 0
    assert second.prefix_len == len(first.prompt_ids) + len(first.output_ids)
    assert second.segment == first.segment == 0


async def test_stream_sends_the_reply_and_usage_last(episode) -> None:
    client, _, _ = episode
    body = {
        "model": "student",
        "messages": [{"role": "user", "content": "Hi"}],
        "temperature": 0,
        "max_tokens": 8,
    }
    whole = await client.chat.completions.create(**body)
    chunks = [
        c
        async for c in await client.chat.completions.create(
            **body, stream=True, stream_options={"include_usage": True}
        )
    ]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert not chunks[-1].choices and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]


async def test_n_choices_are_one_request_and_n_turns(episode) -> None:
    client, _, rec = episode
    r = await client.chat.completions.create(
        model="student",
        messages=[{"role": "user", "content": "Hi"}],
        n=3,
        max_tokens=6,
        seed=1,
        extra_body={"return_token_ids": True},
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [t.choice_index for t in rec.turns] == [0, 1, 2]
    assert len({t.request_id for t in rec.turns}) == 1 and rec.turns[0].request_id == r.id
    assert [t.output_ids for t in rec.turns] == [c.token_ids for c in r.choices]  # type: ignore[attr-defined]
    assert r.usage.prompt_tokens == len(rec.turns[0].prompt_ids)  # type: ignore[union-attr]


async def test_recorded_ids_are_the_template_and_what_the_engine_produced(
    served, episode, torch_engine: TorchEngine
) -> None:
    client, _, rec = episode
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    r = await client.chat.completions.create(
        model="student",
        messages=messages,
        temperature=0,
        max_tokens=12,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    (turn,) = rec.turns
    tok = torch_engine.tokenizer
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)  # type: ignore[union-attr]
    assert turn.prompt_ids == list(tok.encode(text, add_special_tokens=False))  # type: ignore[union-attr]
    params = SamplingParams(max_new_tokens=12, temperature=0, stop_token_ids=served[0].stop_ids)
    (direct,) = await torch_engine.generate([turn.prompt_ids], params)
    assert turn.output_ids == direct.output_ids == r.choices[0].token_ids  # type: ignore[attr-defined]
    assert turn.logprobs is not None and len(turn.logprobs) == len(turn.output_ids)
    assert [c.logprob for c in r.choices[0].logprobs.content] == turn.logprobs  # type: ignore[union-attr]
    assert turn.weight_version == torch_engine.weight_version and turn.engine == "gateway:torch"
    assert json.loads(turn.request_json)["messages"] == messages


async def test_a_reply_the_tokenizer_would_split_otherwise_stays_the_models_tokens(
    served, torch_engine
) -> None:
    """A sampled reply can be a split the tokenizer never makes (e.g. "ier" + "re" where it
    encodes "ierre"): when the client sends it back, the next prompt continues from the model's
    own ids (one segment, stored linearly), not from a re-encoding that would differ."""
    gateway, url = served
    tok = torch_engine.tokenizer
    convo = [{"role": "user", "content": "Write two short paragraphs about the sea."}]
    for seed in range(24):  # find a sampled reply whose ids are not the text's encoding
        rec = Recorded()
        async with gateway.episode(run_id="r", episode_id=f"ep{seed}", emit=rec.emit) as ep:
            client = openai.AsyncOpenAI(base_url=url, api_key=ep.credential, max_retries=0)
            r = await client.chat.completions.create(
                model="student", messages=convo, temperature=1.0, seed=seed, max_tokens=48
            )
            (first,) = rec.turns
            text = tok.decode(first.output_ids, skip_special_tokens=True)
            if tok.encode(text, add_special_tokens=False) == list(first.output_ids):
                await client.close()
                continue
            history = [
                *convo,
                {"role": "assistant", "content": r.choices[0].message.content},
                {"role": "user", "content": "Go on."},
            ]
            await client.chat.completions.create(
                model="student", messages=history, temperature=0, max_tokens=4
            )
            await client.close()
            _, second = rec.turns
            assert second.segment == first.segment == 0
            assert second.prefix_len == len(first.prompt_ids) + len(first.output_ids)
            return
    pytest.fail("no seed in 0..23 sampled a reply outside the tokenizer's own split")


async def test_a_rewritten_history_starts_a_new_segment(episode) -> None:
    client, _, rec = episode
    convo = [{"role": "user", "content": "Name a fruit."}]
    r = await client.chat.completions.create(
        model="student", messages=convo, temperature=0, max_tokens=8
    )
    convo += [
        {"role": "assistant", "content": r.choices[0].message.content},
        {"role": "user", "content": "Another one."},
    ]
    await client.chat.completions.create(
        model="student", messages=convo, temperature=0, max_tokens=8
    )
    summary = [{"role": "user", "content": "Summary: we named a fruit. Name a third."}]
    await client.chat.completions.create(
        model="student", messages=summary, temperature=0, max_tokens=8
    )
    assert [t.segment for t in rec.turns] == [0, 0, 1]
    assert [t.turn for t in rec.turns] == [0, 1, 2]
    # the continued call stores its new ids only; the rewritten one its whole prompt
    assert [t.prefix_len > 0 for t in rec.turns] == [False, True, False]


async def test_a_stop_string_cuts_the_reply_and_the_recorded_ids(episode, torch_engine) -> None:
    client, _, rec = episode
    body = {
        "model": "student",
        "messages": [{"role": "user", "content": "Count: 1, 2, 3, 4"}],
        "temperature": 0,
        "max_tokens": 24,
    }
    full = (await client.chat.completions.create(**body)).choices[0].message.content or ""
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    assert stop.strip()
    cut = await client.chat.completions.create(**body, stop=[stop])
    text = cut.choices[0].message.content or ""
    assert cut.choices[0].finish_reason == "stop" and text == full[: full.index(stop)]
    kept = rec.turns[-1].output_ids
    decoded = torch_engine.tokenizer.decode(kept, skip_special_tokens=True)  # type: ignore[union-attr]
    assert (
        stop in decoded
        and stop
        not in torch_engine.tokenizer.decode(  # type: ignore[union-attr]
            kept[:-1], skip_special_tokens=True
        )
    )


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": []}, "messages"),
        ({"temperature": "hot"}, "temperature"),
        ({"n": 0}, "n"),
        ({"tools": [{"type": "function"}]}, "tools[0]"),
        ({"tool_choice": "required"}, "tool_choice"),  # no tools to call
        ({"top_logprobs": 3, "logprobs": True}, "top_logprobs"),
    ],
)
async def test_a_bad_request_is_a_400_naming_the_field(episode, extra, param) -> None:
    client, _, rec = episode
    body = {"model": "student", "messages": [{"role": "user", "content": "hi"}], **extra}
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(**body)
    assert err.value.status_code == 400
    assert isinstance(err.value.body, dict) and err.value.body["param"] == param
    assert not rec.turns
    (refused,) = rec.refused  # the answer is kept in the run, naming the same field
    assert (refused.status, refused.param) == (400, param)


async def test_unknown_fields_and_non_json_are_400s(served) -> None:
    _, url = served
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/chat/completions", data=b"{not json") as resp:
            assert (
                resp.status == 400
                and (await resp.json())["error"]["type"] == "invalid_request_error"
            )
        body = {"messages": [{"role": "user", "content": "hi"}], "temprature": 0.5}
        async with http.post(f"{url}/chat/completions", json=body) as resp:
            assert resp.status == 400 and (await resp.json())["error"]["param"] == "temprature"


async def test_calls_without_a_known_credential_are_refused_in_launcher_mode(
    torch_engine: TorchEngine,
) -> None:
    gateway = Gateway(
        torch_engine,
        torch_engine.tokenizer,  # type: ignore[arg-type]
        model_name="student",
        require_episode=True,
    )
    async with serve_tcp(gateway) as url:
        client = openai.AsyncOpenAI(base_url=url, api_key="guess", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await client.models.list()
        rec = Recorded()
        async with gateway.episode(run_id="r", episode_id="e", emit=rec.emit) as ep:
            # the credential may also be the URL path (for scaffolds that send no key)
            by_path = openai.AsyncOpenAI(
                base_url=url.replace("/v1", f"/e/{ep.credential}/v1"),
                api_key="unused",
                max_retries=0,
            )
            await by_path.completions.create(model="student", prompt="Hello", max_tokens=3)
            assert len(rec.turns) == 1 and rec.turns[0].episode_id == "e"

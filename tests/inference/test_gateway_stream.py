"""Token-by-token streaming through the model gateway, with the official `openai` client and
the real SmolLM2 engine: many chunks whose text is the non-streamed reply, the first delta while
the engine is still generating, stop strings cut across token boundaries, tool calls, n > 1,
a disconnect that aborts the generation, and the fallback for an engine that cannot stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import openai
import pytest

from stacx.inference.gateway import Gateway, GatewayEpisode, serve_tcp
from stacx.inference.sglang_client import SGLangEngine
from stacx.inference.streaming import TextStream
from stacx.inference.torch_engine import TorchEngine
from stacx.ports import StreamsGenerations
from tests.inference.test_gateway import BASH, COPY_CALL, Recorded

pytestmark = pytest.mark.model

STORY = [{"role": "user", "content": "Tell me a long story about a cat and a dog."}]


@pytest.fixture
async def episode(
    torch_engine: TorchEngine,
) -> AsyncIterator[tuple[openai.AsyncOpenAI, GatewayEpisode, Recorded]]:
    gateway = Gateway(torch_engine, torch_engine.tokenizer, model_name="student", max_len=2048)  # type: ignore[arg-type]
    rec = Recorded()
    async with (
        serve_tcp(gateway) as url,
        gateway.episode(run_id="r", episode_id="ep", emit=rec.emit) as ep,
    ):
        client = openai.AsyncOpenAI(base_url=url, api_key=ep.credential, max_retries=0)
        yield client, ep, rec
        await client.close()


def _contents(chunks: list, index: int = 0) -> list[str]:
    return [
        c.choices[0].delta.content
        for c in chunks
        if c.choices and c.choices[0].index == index and c.choices[0].delta.content
    ]


async def test_a_long_reply_streams_in_chunks_that_join_to_the_unstreamed_reply(episode) -> None:
    client, _, rec = episode
    body = {
        "model": "student",
        "messages": STORY,
        "temperature": 0.8,
        "seed": 5,
        "max_tokens": 40,
        "extra_body": {"return_token_ids": True},
    }
    whole = await client.chat.completions.create(**body)
    chunks = [
        c
        async for c in await client.chat.completions.create(
            **body, stream=True, stream_options={"include_usage": True}
        )
    ]
    texts = _contents(chunks)
    assert len(texts) > 10  # one per token or so, not one at the end
    assert "".join(texts) == whole.choices[0].message.content
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == [whole.choices[0].finish_reason]
    assert not chunks[-1].choices and chunks[-1].usage == whole.usage
    unstreamed, streamed = rec.turns
    assert streamed.output_ids == unstreamed.output_ids == whole.choices[0].token_ids  # type: ignore[attr-defined]
    assert streamed.prompt_ids == unstreamed.prompt_ids
    # the second call reuses the first's cached prompt keys: equal up to float rounding
    assert streamed.logprobs == pytest.approx(unstreamed.logprobs, abs=1e-4)


async def test_the_first_delta_comes_mid_generation_and_a_disconnect_aborts_it(
    episode, torch_engine: TorchEngine
) -> None:
    client, _, rec = episode
    assert isinstance(torch_engine, StreamsGenerations) and torch_engine.running == 0
    stream = await client.chat.completions.create(
        model="student",
        messages=STORY,
        temperature=0,
        max_tokens=1500,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            # the engine's request still holds its slot: this text left before it finished
            assert torch_engine.running == 1
            steps = torch_engine.stats["decode_steps"]
            break
    await stream.close()  # the client disconnects mid-stream
    for _ in range(600):  # the gateway sees it at the next delta, the engine at its next step
        if torch_engine.running == 0:
            break
        await asyncio.sleep(0.05)
    assert torch_engine.running == 0
    assert torch_engine.stats["decode_steps"] - steps < 1400  # aborted, not run to 1500 tokens
    assert rec.turns == []  # nobody saw that reply: nothing recorded
    # the engine and the gateway serve the next call as usual
    r = await client.chat.completions.create(
        model="student", messages=STORY, max_tokens=3, extra_body={"return_token_ids": True}
    )
    assert len(r.choices[0].token_ids) == 3 and len(rec.turns) == 1  # type: ignore[attr-defined]


async def test_a_stop_string_split_across_tokens_is_cut_exactly(episode, torch_engine) -> None:
    client, _, rec = episode
    body = {"model": "student", "messages": STORY, "temperature": 0, "max_tokens": 30}
    free = await client.chat.completions.create(**body, extra_body={"return_token_ids": True})
    full, ids = free.choices[0].message.content or "", free.choices[0].token_ids  # type: ignore[attr-defined]
    tok = torch_engine.tokenizer
    stop, at = "", -1
    for k in range(
        4, len(ids) - 1
    ):  # a stop string made of the end of token k and the next one's start
        head, a, b = tok.decode(ids[:k]), tok.decode(ids[k : k + 1]), tok.decode(ids[k + 1 : k + 2])
        if len(a.strip()) >= 2 and len(b.strip()) >= 2:
            stop, at = a[-2:] + b[:2], len(head) + len(a) - 2
            if full.find(stop) == at:
                break
    assert full.find(stop) == at > 0
    # past EOS to 400 tokens, unless the stop string ends the engine's work (it does)
    body |= {"max_tokens": 400, "extra_body": {"ignore_eos": True}}
    steps = torch_engine.stats["decode_steps"]
    cut = await client.chat.completions.create(**body, stop=[stop])
    chunks = [
        c async for c in await client.chat.completions.create(**body, stop=[stop], stream=True)
    ]
    assert torch_engine.stats["decode_steps"] - steps < 2 * 100
    assert "".join(_contents(chunks)) == full[:at] == cut.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["stop"]
    kept = rec.turns[-1].output_ids
    assert kept == rec.turns[-2].output_ids == ids[: len(kept)]  # the same cut ids recorded,
    assert stop in tok.decode(kept) and stop not in tok.decode(kept[:-1])  # after the stop's end


async def test_a_tool_call_streams_as_one_tool_calls_delta(episode) -> None:
    client, _, rec = episode
    body = {
        "model": "student",
        "messages": [{"role": "user", "content": COPY_CALL}],
        "tools": [BASH],
        "temperature": 0,
        "max_tokens": 40,
    }
    whole = await client.chat.completions.create(**body)
    chunks = [c async for c in await client.chat.completions.create(**body, stream=True)]
    assert not any("<tool_call" in t for t in _contents(chunks))  # held back, then parsed
    (call_chunk,) = [c for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    (call,) = call_chunk.choices[0].delta.tool_calls or []
    assert call.index == 0 and call.id and call.type == "function"
    assert call.function and call.function.name == "bash"
    assert json.loads(call.function.arguments or "") == {"command": "ls"}
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason == "tool_calls"
    assert rec.turns[0].output_ids == rec.turns[1].output_ids


async def test_n_choices_stream_interleaved_by_index(episode) -> None:
    client, _, rec = episode
    body = {"model": "student", "messages": STORY, "n": 2, "seed": 3, "max_tokens": 16}
    whole = await client.chat.completions.create(**body)
    chunks = [c async for c in await client.chat.completions.create(**body, stream=True)]
    order = [c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.content]
    assert order.index(1) < len(order) - 1 - order[::-1].index(
        0
    )  # interleaved, not one after the other
    for i in (0, 1):
        assert "".join(_contents(chunks, i)) == whole.choices[i].message.content
    assert [t.output_ids for t in rec.turns[2:]] == [t.output_ids for t in rec.turns[:2]]


async def test_an_engine_that_cannot_stream_sends_its_text_at_the_end(
    serve_url: str, torch_engine: TorchEngine
) -> None:
    remote = SGLangEngine(serve_url)  # a real engine without the streaming capability
    assert not isinstance(remote, StreamsGenerations)
    gateway = Gateway(remote, torch_engine.tokenizer, model_name="student", max_len=2048)  # type: ignore[arg-type]
    try:
        async with serve_tcp(gateway) as url:
            client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0)
            body = {
                "model": "student",
                "prompt": "Once upon a time",
                "temperature": 0,
                "max_tokens": 12,
            }
            whole = await client.completions.create(**body)
            chunks = [c async for c in await client.completions.create(**body, stream=True)]
            texts = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
            assert len(texts) == 1 and texts[0] == whole.choices[0].text
            assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
            await client.close()
    finally:
        await remote.close()


def test_text_pieces_never_split_a_character_and_hold_back_a_possible_stop(torch_engine) -> None:
    tok = torch_engine.tokenizer
    text = "Café 😀 中文, then STOP here"
    ids = tok.encode(text)
    assert len(ids) > len(text.split())  # multi-byte characters span several byte-level ids
    stream = TextStream(lambda i: tok.decode(i), ["STOP"], tools=False)
    pieces = [stream.push([t]) for t in ids]
    assert not any("\ufffd" in p for p in pieces)
    assert "".join(pieces) == text[: text.index("STOP")] and stream.done
    # "ST" is held back while it may become "STOP", and sent once it cannot
    partial = TextStream(lambda i: tok.decode(i), ["STOP"], tools=False)
    sent = "".join(partial.push([t]) for t in tok.encode("go ST"))
    assert sent == "go " and partial.rest("go ST") == "ST"

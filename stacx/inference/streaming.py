"""Streaming for the model gateway: generations as deltas from any engine (one per prompt at the
end where it cannot stream), and each choice's text released only where it can no longer change.

The text sent is always a prefix of the non-streamed reply (for prefix-stable tokenizers:
byte-level BPE), and stop strings end a call's generations early, with the same recorded ids.
Design: docs/scaffolds.md#streaming
"""

from __future__ import annotations

import bisect
import contextlib
import json
import time
from collections.abc import AsyncGenerator, Callable

from aiohttp import web

from stacx.inference.openai_api import Json
from stacx.ports import Engine, Generation, GenerationDelta, SamplingParams, StreamsGenerations
from stacx.toolcalls import OPEN_TAG


async def sse_response(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    return resp


def sse(data: object, event: str = "") -> bytes:
    """One server-sent event of `data` as JSON (a str as it is: ``[DONE]``)."""
    payload = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


class StreamClosed(Exception):
    """A stream ended before its finish chunks: the client disconnected, or the engine failed
    after the first chunk (an error event was sent); `resp` is the response, if prepared."""

    def __init__(self, resp: web.StreamResponse | None) -> None:
        super().__init__("the stream was closed before its end")
        self.resp = resp


async def stream_generations(
    engine: Engine, prompts: list[list[int]], params: SamplingParams
) -> AsyncGenerator[GenerationDelta, None]:
    """The engine's generations as deltas (one per prompt at the end where it cannot stream)."""
    if isinstance(engine, StreamsGenerations):
        async with contextlib.aclosing(engine.generate_stream(prompts, params)) as deltas:
            async for d in deltas:
                yield d
        return
    for i, gen in enumerate(await engine.generate(prompts, params)):
        yield GenerationDelta(
            index=i, output_ids=gen.output_ids, logprobs=gen.logprobs, generation=gen
        )


class TextStream:
    """One choice's text as its ids arrive; `push` returns what may be sent now."""

    def __init__(
        self,
        decode: Callable[[list[int]], str],
        stops: list[str],
        tools: bool,
        *,
        held: bool = False,
    ) -> None:
        self.decode, self.stops, self.tools = decode, stops, tools
        self.ids: list[int] = []
        self.text = ""  # the decoded text of `ids`, less an incomplete last character
        self.sent = ""  # the prefix of `text` sent so far
        self._prefix = self._read = 0  # the decode window (vLLM's prefix and read offsets)
        self.held = held  # nothing goes out until the end (a reply continuing a forced call)
        self.done = False  # a stop string (or a tool call) appeared: nothing more goes out
        self.stopped = False  # a stop string appeared: the rest of the generation is not needed

    def push(self, ids: list[int]) -> str:
        self.ids += ids
        if self.done or not ids:
            return ""
        # vLLM's incremental detokenization: decode a window that starts a few ids back (so a
        # tokenizer's start-of-text rules do not apply to it) and keep what it adds, unless it
        # ends in an incomplete character
        prefix = self.decode(self.ids[self._prefix : self._read])
        window = self.decode(self.ids[self._prefix :])
        if len(window) > len(prefix) and not window.endswith("\ufffd"):
            self.text += window[len(prefix) :]
            self._prefix, self._read = self._read, len(self.ids)
        text, start = self.text, len(self.sent)
        safe = len(text)
        hits = [i for s in self.stops if (i := text.find(s, start)) >= 0]
        if hits:
            safe, self.done, self.stopped = min(hits), True, True
        elif self.stops:
            safe = _partial_start(text, self.stops)
        if self.tools:
            at = text.find(OPEN_TAG, start)
            if at >= 0:
                safe, self.done = min(safe, at), True
            else:
                safe = min(safe, _partial_start(text, [OPEN_TAG]))
            safe = len(text[:safe].rstrip())
        if safe <= start or self.held:
            return ""
        new = text[start:safe]
        self.sent += new
        return new

    def rest(self, final: str) -> str:
        """What is left to send of `final`, the choice's whole text as the call cuts it."""
        return final[len(self.sent) :] if final.startswith(self.sent) else ""


def _partial_start(text: str, patterns: list[str]) -> int:
    """Start of the longest suffix of `text` that is a proper prefix of a pattern (else len)."""
    start = len(text)
    for p in patterns:
        for k in range(min(len(p) - 1, len(text)), 0, -1):
            if text.endswith(p[:k]):
                start = min(start, len(text) - k)
                break
    return start


class ChoiceStreams:
    """The SSE side of one streamed call: first chunks at the engine's first delta, text deltas,
    then `finish`. Raises `StreamClosed` once the connection is seen closed (at every delta)."""

    def __init__(
        self,
        request: web.Request,
        base: Json,
        texts: list[TextStream],
        *,
        chat: bool,
        usage: bool,
        heads: list[str] | None = None,
        token_ids: bool = False,
    ) -> None:
        self.request, self.base, self.texts, self.chat = request, base, texts, chat
        self.usage, self.heads = usage, heads
        self.token_ids = token_ids  # each choice's last chunk carries its ``token_ids``
        self.resp: web.StreamResponse | None = None

    @property
    def connected(self) -> bool:
        transport = self.request.transport
        return transport is not None and not transport.is_closing()

    async def delta(self, d: GenerationDelta) -> None:
        if self.resp is None:
            if not self.connected:
                raise StreamClosed(None)
            self.resp = await sse_response(self.request)
            for i in range(len(self.texts)):
                head = self.heads[i] if self.heads else ""
                if self.chat:
                    await self._send(i, {"role": "assistant", "content": head})
                elif head:
                    await self._send(i, head)
        new = self.texts[d.index].push(d.output_ids)
        if new:
            await self._send(d.index, {"content": new} if self.chat else new)
        elif not self.connected:
            raise StreamClosed(self.resp)

    async def finish(
        self, choices: list[Json], finals: list[str], usage: Json
    ) -> web.StreamResponse:
        """The rest of each choice's text (`finals`: the non-streamed texts), tool calls, finish
        reason; usage if asked; ``[DONE]``. A client gone by now just misses them."""
        assert self.resp is not None  # the last delta of every choice came through `delta`
        with contextlib.suppress(StreamClosed):
            for c, text, final in zip(choices, self.texts, finals, strict=True):
                i, rest = c["index"], text.rest(final)
                if rest:
                    await self._send(i, {"content": rest} if self.chat else rest)
                calls = c.get("message", {}).get("tool_calls")
                if calls:
                    await self._send(
                        i, {"tool_calls": [{"index": k, **t} for k, t in enumerate(calls)]}
                    )
                ids = {"token_ids": c["token_ids"]} if self.token_ids else {}
                end = {"logprobs": c["logprobs"], "finish_reason": c["finish_reason"], **ids}
                await self._send(i, {} if self.chat else "", **end)
            if self.usage:
                await self._chunk([], usage=usage)
            await self._write(sse("[DONE]"))
            await self.resp.write_eof()
        return self.resp

    async def error(self, error: Json) -> StreamClosed:
        """Send `error` (an OpenAI error object) as the last event; return what to raise."""
        with contextlib.suppress(StreamClosed):
            await self._write(sse(error))
            await self._write(sse("[DONE]"))
        return StreamClosed(self.resp)

    async def _send(self, index: int, piece: Json | str, **end: object) -> None:
        key = "text" if isinstance(piece, str) else "delta"
        await self._chunk(
            [{"index": index, key: piece, "logprobs": None, "finish_reason": None, **end}]
        )

    async def _chunk(self, choices: list[Json], **extra: object) -> None:
        chunk = {
            **self.base,
            "choices": choices,
            **({"usage": None} if self.usage else {}),
            **extra,
        }
        await self._write(sse(chunk))

    async def _write(self, data: bytes) -> None:
        assert self.resp is not None
        try:
            await self.resp.write(data)
        except ConnectionError as exc:  # aiohttp's ClientConnectionResetError is one
            raise StreamClosed(self.resp) from exc


async def run_choices(
    engine: Engine,
    prompts: list[list[int]],
    params: SamplingParams,
    streams: ChoiceStreams | None,
    texts: list[TextStream] | None,
) -> list[Generation]:
    """The engine's generations, streamed to `streams`; given `texts` (stop strings), ended once
    every choice is done or wrote one (its Generation built here from the ids handed over)."""
    if streams is None and texts is None:
        return await engine.generate(prompts, params)
    gens: list[Generation | None] = [None] * len(prompts)
    parts: list[tuple[list[int], list[float]]] = [([], []) for _ in prompts]
    t0 = time.monotonic()
    async with contextlib.aclosing(stream_generations(engine, prompts, params)) as deltas:
        async for d in deltas:
            if d.generation is not None:
                gens[d.index] = d.generation
            else:
                parts[d.index][0].extend(d.output_ids)
                parts[d.index][1].extend(d.logprobs or [])
            if streams is not None:
                await streams.delta(d)  # StreamClosed leaves the stream: the engine aborts
            elif texts is not None:
                texts[d.index].push(d.output_ids)
            pending = [t for g, t in zip(gens, texts or [], strict=False) if g is None]
            if texts and all(t.stopped for t in pending):
                break  # leaving the stream aborts the engine's unfinished requests
    ms = (time.monotonic() - t0) * 1e3
    return [
        g
        or Generation(
            output_ids=ids,
            logprobs=lps,
            finish_reason="stop",
            weight_version=engine.weight_version,
            gen_ms=ms,
        )
        for g, (ids, lps) in zip(gens, parts, strict=True)
    ]


def cut_at_stop(
    decode: Callable[[list[int]], str], gen: Generation, stops: list[str], keep: str = ""
) -> tuple[Generation, str, bool]:
    """The generation cut after the token completing its first stop string, its text without it
    (with it if `keep`), and whether a stop string ended it (vLLM's semantics)."""
    text = decode(gen.output_ids)
    hits = [(text.find(s), s) for s in stops if s in text]
    if not hits:
        return gen, text, False
    at, stop = min(hits)
    ids = gen.output_ids  # cut after the shortest prefix whose text holds the stop string
    lo = 1 + bisect.bisect_left(range(1, len(ids)), True, key=lambda k: stop in decode(ids[:k]))
    cut = Generation(
        output_ids=gen.output_ids[:lo],
        logprobs=None if gen.logprobs is None else gen.logprobs[:lo],
        finish_reason="stop",
        weight_version=gen.weight_version,
        gen_ms=gen.gen_ms,
        queue_ms=gen.queue_ms,
    )
    return cut, text[: at + len(stop) if stop == keep else at], True

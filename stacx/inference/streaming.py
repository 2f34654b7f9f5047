"""Streaming for the model gateway: generations as deltas from any engine, and each choice's
text as its ids arrive, released only where it can no longer change.

`stream_generations` uses an engine's `StreamsGenerations` capability (the torch engine hands
over each step's ids) and falls back to one delta per prompt at the end for an engine without
it, so every engine streams (the SGLang and OpenAI clients: one chunk per choice at the end).
`run_choices` runs a call's generations (streamed, and ended early once every choice has
written a stop string); `cut_at_stop` cuts a finished generation at its first stop string.

`TextStream` decodes a choice's ids as they arrive and holds back what may still change or be
cut: an incomplete UTF-8 character (the decode ends in U+FFFD), text that could be the start of
a stop string (vLLM's rule), and, where tool calls are parsed, everything from a ``<tool_call>``
opening (or the start of one) on, and trailing whitespace (the content before a call is
stripped). The text sent is therefore always a prefix of the text the non-streamed call
returns, and the rest is sent once the generation is done and cut. Special tokens are whole
ids, so no decode splits one.

Limits: the prefix property assumes a tokenizer whose decode of a longer id list extends the
decode of a shorter one (byte-level BPE: SmolLM2, Qwen, Llama 3; a tokenizer that cleans up
spaces before punctuation can break it, and then the late part of the text is not re-sent).
Each arrival decodes a window of the last few ids (vLLM's offsets), so the cost per token does
not grow with the reply.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from aiohttp import web

from stacx.ports import Engine, Generation, GenerationDelta, SamplingParams, StreamsGenerations
from stacx.toolcalls import OPEN_TAG

Json = dict[str, Any]


class StreamClosed(Exception):
    """A stream ended before its finish chunks: the client disconnected, or the engine failed
    after the first chunk (an error event was sent); `resp` is the response, if prepared."""

    def __init__(self, resp: web.StreamResponse | None) -> None:
        super().__init__("the stream was closed before its end")
        self.resp = resp


async def stream_generations(
    engine: Engine, prompts: list[list[int]], params: SamplingParams
) -> AsyncGenerator[GenerationDelta, None]:
    """The engine's generations as deltas: streamed where the engine can, else one per prompt
    once `generate` returns."""
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
        """`held`: nothing goes out as it comes (a reply that continues a prefilled tool call:
        its text is all part of the call, sent whole at the end)."""
        self.decode, self.stops, self.tools = decode, stops, tools
        self.ids: list[int] = []
        self.text = ""  # the decoded text of `ids`, less an incomplete last character
        self.sent = ""  # the prefix of `text` sent so far
        self._prefix = self._read = 0  # the decode window (vLLM's prefix and read offsets)
        self.held = held
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
        """What is left to send of `final` (the choice's whole text, cut as the non-streamed
        call cuts it)."""
        return final[len(self.sent) :] if final.startswith(self.sent) else ""


def _partial_start(text: str, patterns: list[str]) -> int:
    """Where the longest suffix of `text` that is a proper prefix of a pattern begins
    (len(text) if none)."""
    start = len(text)
    for p in patterns:
        for k in range(min(len(p) - 1, len(text)), 0, -1):
            if text.endswith(p[:k]):
                start = min(start, len(text) - k)
                break
    return start


class ChoiceStreams:
    """The SSE side of one streamed call: a first chunk per choice (the role, or the echoed
    prompt) once the engine's first delta arrives, each choice's text deltas, then the finish
    chunks, the usage chunk and ``[DONE]`` in `finish`. Raises `StreamClosed` as soon as the
    connection is seen closed (checked at every engine delta, so within one decode step)."""

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
        """`token_ids`: each choice's last chunk carries its ``token_ids`` (the request's
        ``return_token_ids``)."""
        self.request, self.base, self.texts, self.chat = request, base, texts, chat
        self.usage, self.heads, self.token_ids = usage, heads, token_ids
        self.resp: web.StreamResponse | None = None

    @property
    def connected(self) -> bool:
        transport = self.request.transport
        return transport is not None and not transport.is_closing()

    async def delta(self, d: GenerationDelta) -> None:
        if self.resp is None:
            if not self.connected:
                raise StreamClosed(None)
            self.resp = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            await self.resp.prepare(self.request)
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
        """The rest of each choice's text (`finals`: its whole text, as the non-streamed call
        returns it), its tool calls and finish reason; usage if asked; ``[DONE]``. A client gone
        by now just misses them (the call is recorded)."""
        assert self.resp is not None  # the last delta of every choice came through `delta`
        with contextlib.suppress(StreamClosed):
            await self._finish(choices, finals, usage)
        return self.resp

    async def _finish(self, choices: list[Json], finals: list[str], usage: Json) -> None:
        assert self.resp is not None
        for c, text, final in zip(choices, self.texts, finals, strict=True):
            i = c["index"]
            rest = text.rest(final)
            if rest:
                await self._send(i, {"content": rest} if self.chat else rest)
            calls = c.get("message", {}).get("tool_calls")
            if calls:
                await self._send(
                    i, {"tool_calls": [{"index": k, **t} for k, t in enumerate(calls)]}
                )
            end: Json = {"index": i, "logprobs": c["logprobs"], "finish_reason": c["finish_reason"]}
            if self.token_ids:
                end["token_ids"] = c["token_ids"]
            if self.chat:
                end["delta"] = {}
            else:
                end["text"] = ""
            await self._chunk([end])
        if self.usage:
            await self._chunk([], usage=usage)
        await self._write(b"data: [DONE]\n\n")
        await self.resp.write_eof()

    async def error(self, error: Json) -> StreamClosed:
        """Send `error` (an OpenAI error object) as the stream's last event; the exception to
        raise."""
        with contextlib.suppress(StreamClosed):
            await self._write(b"data: " + json.dumps(error).encode() + b"\n\n")
            await self._write(b"data: [DONE]\n\n")
        return StreamClosed(self.resp)

    async def _send(self, index: int, piece: Json | str) -> None:
        if isinstance(piece, str):
            await self._chunk(
                [{"index": index, "text": piece, "logprobs": None, "finish_reason": None}]
            )
        else:
            await self._chunk(
                [{"index": index, "delta": piece, "logprobs": None, "finish_reason": None}]
            )

    async def _chunk(self, choices: list[Json], **extra: object) -> None:
        chunk = {
            **self.base,
            "choices": choices,
            **({"usage": None} if self.usage else {}),
            **extra,
        }
        await self._write(b"data: " + json.dumps(chunk).encode() + b"\n\n")

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
    """The engine's generations; streamed to `streams`, and, given `texts` (there are stop
    strings), ended early once every choice is done or has written a stop string: the rest
    would be cut. Such a choice's Generation is built here ("stop", the engine's version
    now, the call's wall time), from the ids the engine handed over."""
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
    """The generation cut after the first token that completes a stop string, its text (by
    `decode`) without the stop string (with it, when it is `keep`), and whether a stop string
    ended it (vLLM's semantics)."""
    text = decode(gen.output_ids)
    hits = [(text.find(s), s) for s in stops if s in text]
    if not hits:
        return gen, text, False
    at, stop = min(hits)
    lo, hi = 1, len(gen.output_ids)  # the shortest prefix whose text holds the stop string
    while lo < hi:
        mid = (lo + hi) // 2
        if stop in decode(gen.output_ids[:mid]):
            hi = mid
        else:
            lo = mid + 1
    cut = Generation(
        output_ids=gen.output_ids[:lo],
        logprobs=None if gen.logprobs is None else gen.logprobs[:lo],
        finish_reason="stop",
        weight_version=gen.weight_version,
        gen_ms=gen.gen_ms,
        queue_ms=gen.queue_ms,
    )
    return cut, text[: at + len(stop) if stop == keep else at], True

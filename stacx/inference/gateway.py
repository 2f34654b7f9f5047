"""The model gateway: an OpenAI-compatible HTTP front of any `Engine` that records every call as
token ids, so black-box scaffolds (mini-swe-agent, ...) can be trained token-faithfully.

An episode's call is recorded (one `TurnGenerated` per choice, exact ids) before its response is
sent, and its error answers as `GatewayRefused`; a streamed reply joins to the non-streamed one.
Design: docs/scaffolds.md#gateway-reference
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Sequence

import msgspec
from aiohttp import web

from stacx.errors import EngineError
from stacx.events import Emit, new_id
from stacx.inference import anthropic_api
from stacx.inference.anthropic_api import anthropic_errors
from stacx.inference.chat_template import (
    Opening,
    ToolChoice,
    pick_function,
    response_grammar,
    template_messages,
    turn_stop_ids,
)
from stacx.inference.gateway_episode import GatewayEpisode
from stacx.inference.openai_api import (
    CHAT_KEYS,
    COMPLETION_KEYS,
    MAX_N,
    ApiError,
    Handler,
    Json,
    include_usage,
    json_object,
    openai_errors,
    opt,
    request_body,
    request_tools,
    shown,
    stop_strings,
    tool_call_json,
)
from stacx.inference.streaming import (
    ChoiceStreams,
    StreamClosed,
    TextStream,
    cut_at_stop,
    run_choices,
)
from stacx.ports import ChatTokenizer, Engine, Generation, SamplingParams
from stacx.toolcalls import parse_tool_calls


class Gateway:
    """The OpenAI routes over one engine and its tokenizer (docs/scaffolds.md#gateway-reference)."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: ChatTokenizer,
        *,
        model_name: str,
        aliases: Sequence[str] = (),
        max_len: int = 8192,
        default_max_tokens: int = 1024,
        require_episode: bool = False,
    ) -> None:
        self.engine, self.tok, self.model_name = engine, tokenizer, model_name
        # the names a request's `model` may carry; anything else is a 404 model_not_found
        self.model_names = tuple(dict.fromkeys((model_name, *aliases)))
        self.max_len, self.default_max_tokens = max_len, default_max_tokens
        self.require_episode = require_episode  # unknown credentials get 401 (launcher mode)
        self.native_tools = "tools" in (tokenizer.chat_template or "")
        self.stop_ids = turn_stop_ids(tokenizer)
        self._episodes: dict[str, GatewayEpisode] = {}
        self.tool_choice = ToolChoice(tokenizer, self.native_tools)
        # the engine decodes under a grammar (SamplingParams.grammar): forced calls' arguments
        # follow the tool's schema, response_format JSON is honoured
        self.grammars = bool(getattr(engine, "grammars", False))

    def add_routes(self, router: web.UrlDispatcher) -> None:
        for prefix in ("", "/e/{credential}"):
            router.add_get(prefix + "/v1/models", self.recorded(self.models))
            router.add_get(prefix + "/v1/models/{model_id:.+}", self.recorded(self.model))
            router.add_post(prefix + "/v1/chat/completions", self.recorded(self.chat_completions))
            router.add_post(prefix + "/v1/completions", self.recorded(self.completions))
            router.add_post(prefix + "/v1/messages", anthropic_errors(self.recorded(self.messages)))

    def recorded(self, handler: Handler) -> Handler:
        """`handler` whose error answers to an episode's calls are recorded (`GatewayRefused`),
        so a scaffold that gets a 4xx leaves a trace in the run, not just 0 turns."""

        async def route(request: web.Request) -> web.StreamResponse:
            try:
                return await handler(request)
            except ApiError as err:
                ep = self._episodes.get(_credential(request))
                if ep is not None:
                    await ep.refused(request.path, err.status, err.error)
                raise

        return route

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024**2, middlewares=[openai_errors])
        self.add_routes(app.router)
        return app

    @contextlib.asynccontextmanager
    async def episode(
        self, *, run_id: str, episode_id: str, emit: Emit
    ) -> AsyncIterator[GatewayEpisode]:
        """Attribute calls made with the yielded credential to `episode_id` until exit."""
        ep = GatewayEpisode(run_id=run_id, episode_id=episode_id, emit=emit)
        self._episodes[ep.credential] = ep
        try:
            yield ep
        finally:
            del self._episodes[ep.credential]

    async def models(self, request: web.Request) -> web.Response:
        self._episode_of(request)
        cards = [self._model_card(name) for name in self.model_names]
        return web.json_response({"object": "list", "data": cards})

    async def model(self, request: web.Request) -> web.Response:
        """``GET /v1/models/{id}`` (the client's ``models.retrieve``): the card, or 404."""
        self._episode_of(request)
        name = self.served_model(request.match_info["model_id"])
        return web.json_response(self._model_card(name))

    def _model_card(self, name: str) -> Json:
        card = {"id": name, "object": "model", "created": 0, "owned_by": "stacx"}
        return {**card, "max_model_len": self.max_len}

    def served_model(self, name: object) -> str:
        """The model name a request asked for (absent: the served name); 404 model_not_found,
        as OpenAI and vLLM answer, for a name this gateway does not serve."""
        if name is None:
            return self.model_name
        if name not in self.model_names:
            raise ApiError(
                f"The model `{name}` does not exist; this gateway serves "
                f"{', '.join(map(repr, self.model_names))}",
                param="model",
                status=404,
                code="model_not_found",
            )
        return str(name)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        ep = self._counted(request)
        body = await request_body(request, CHAT_KEYS)
        return await self._answer(body, self.chat(body, ep, request))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        ep = self._counted(request)
        body = await request_body(request, COMPLETION_KEYS)
        return await self._answer(body, self._completion(body, ep, request))

    async def _answer(self, body: Json, reply: Awaitable[_Reply]) -> web.StreamResponse:
        """The reply streamed (its finish chunks) or as one JSON; nothing to a client gone."""
        try:
            out, call, finals = await reply
        except StreamClosed as closed:
            return closed.resp or web.Response(status=499)  # nobody reads it
        if call.streams is not None:
            return await call.streams.finish(out["choices"], finals, out["usage"])
        return web.json_response(shown(out, body))

    async def chat(self, body: Json, ep: GatewayEpisode | None, request: web.Request) -> _Reply:
        """One checked OpenAI chat body rendered, generated and recorded (the one path of the
        OpenAI and Anthropic routes): the ``chat.completion``, the call, each choice's content."""
        model = self.served_model(body.get("model"))
        tools = request_tools(body)
        choice_mode = body.get("tool_choice") or "auto"
        options = self.tool_choice.prefills(choice_mode, tools)
        if opt(body, "top_logprobs", int, 0, 20, 0):
            raise ApiError(
                "top_logprobs > 0 is not supported: the engine returns the sampled "
                "token's logprob only",
                param="top_logprobs",
            )
        grammar = response_grammar(body.get("response_format"))
        if grammar and (options[0].prefill or not self.grammars):
            raise ApiError(
                "response_format json_object / json_schema needs an engine that constrains "
                "decoding (the torch engine) and no forced tool_choice",
                param="response_format",
            )
        messages = template_messages(self.native_tools, body.get("messages"), tools, ep)
        kwargs: Json = {"tools": tools} if tools and self.native_tools else {}
        kwargs |= {"tokenize": False, "add_generation_prompt": True}
        try:
            text = self.tok.apply_chat_template(messages, **kwargs)
        except Exception as exc:  # jinja raises its own TemplateError on what it rejects
            raise ApiError(
                f"the chat template rejected the messages: {exc}", param="messages"
            ) from exc
        prompt, opening = await self._prefilled(text, options, body, ep)
        if opening.name and self.grammars:  # the arguments under the tool's schema
            grammar = opening.grammar(tools)
        parse = bool(tools) and choice_mode != "none"
        call = await self._generate(
            body, [prompt], ep, request, parse, opening=opening, grammar=grammar
        )
        choices, finals = self._chat_choices(call, opening.prefill, parse, body, ep)
        return _envelope("chat.completion", call, choices, model), call, finals

    def _chat_choices(
        self, call: _Call, prefill: str, parse: bool, body: Json, ep: GatewayEpisode | None
    ) -> tuple[list[Json], list[str]]:
        """The ``chat.completion`` choices of a generated call (tool calls parsed when `parse`;
        each call id remembered by the episode) and each choice's content."""
        choices, finals = [], []
        for i, (gen, generated, _) in enumerate(call.outputs):
            out_text = prefill + generated  # the assistant message as the model's turn reads
            content, calls = parse_tool_calls(out_text) if parse else (out_text, [])
            finals.append(content)
            message: Json = {"role": "assistant", "content": content}
            lp = self._chat_logprobs(gen) if body.get("logprobs") else None
            fields: Json = {"message": message, "logprobs": lp}
            if calls:
                message["tool_calls"] = [
                    tool_call_json(f"call_{new_id()[:24]}", c.name, json.dumps(c.arguments))
                    for c in calls
                ]
                message["content"] = content or None
                fields["finish_reason"] = "tool_calls"
                if ep is not None:
                    ep.raw_texts[tuple(c["id"] for c in message["tool_calls"])] = out_text
            choices.append(_choice(call, i, fields))
        return choices, finals

    async def _prefilled(
        self,
        text: str,
        options: list[Opening],
        body: Json,
        ep: GatewayEpisode | None,
    ) -> tuple[list[int], Opening]:
        """The prompt ids of `text` + a forced prefill, and its `Opening` (for "required" of
        several tools: `pick_function`, one scoring pass per tool, at the request's seed)."""
        prompts = [
            ep.prompt_ids(text + p, self.tok)
            if ep is not None
            else list(self.tok.encode(text + p, add_special_tokens=False))
            for p, *_ in options
        ]
        if len(options) == 1:
            return prompts[0], options[0]
        params = self._sampling(body, prompts)  # the request's limits, checked once
        # where the names part: the openings differ before the shorter one ends
        at = next(i for i, t in enumerate(zip(*prompts, strict=False)) if len(set(t)) > 1)
        try:  # each call's opening from where the names part, given the prompt before
            scores = [sum(await self.engine.score(p[:at], p[at:])) for p in prompts]
        except EngineError as exc:
            raise ApiError(f"the engine refused the request: {exc}") from exc
        k = pick_function(scores, params.temperature, params.seed)
        return prompts[k], options[k]

    def _chat_logprobs(self, gen: Generation) -> Json:
        return {
            "content": [
                {
                    "token": (s := self.tok.decode([t], skip_special_tokens=False)),
                    "logprob": v,
                    "bytes": list(s.encode()),
                    "top_logprobs": [],
                }
                for t, v in zip(gen.output_ids, gen.logprobs or [], strict=True)
            ]
        }

    async def messages(self, request: web.Request) -> web.StreamResponse:
        """Anthropic's ``POST /v1/messages`` through the chat path (`anthropic_api` translates)."""
        ep = self._counted(request)
        raw = await json_object(request)
        out, _, _ = await self.chat(anthropic_api.chat_body(raw), ep, request)
        msg = anthropic_api.message(out, raw.get("stop_sequences") or [], self.tok.decode)
        if raw.get("stream"):
            return await anthropic_api.send_stream(request, msg)
        return web.json_response(msg)

    async def _completion(
        self, body: Json, ep: GatewayEpisode | None, request: web.Request
    ) -> _Reply:
        model = self.served_model(body.get("model"))
        for key in ("suffix", "best_of"):
            if body.get(key) not in (None, 1) or (key == "suffix" and body.get(key)):
                raise ApiError(f"{key} is not supported", param=key)
        n_lp = opt(body, "logprobs", int, 0, 1, None)
        echo = opt(body, "echo", bool, None, None, False)
        prompts = self._completion_prompts(body.get("prompt"))
        call = await self._generate(body, prompts, ep, request, echo=echo)
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        choices = []
        for i, (gen, out_text, _) in enumerate(call.outputs):
            prompt = call.prompts[i]
            text = (self.tok.decode(prompt) if echo else "") + out_text
            lp = (
                None if n_lp is None else await self._completion_logprobs(gen, prompt, echo, as_ids)
            )
            choices.append(_choice(call, i, {"text": text, "logprobs": lp}))
        finals = [text for _, text, _ in call.outputs]
        return _envelope("text_completion", call, choices, model), call, finals

    async def _completion_logprobs(
        self, gen: Generation, prompt: list[int], echo: bool, as_ids: bool
    ) -> Json:
        """A completion choice's ``logprobs`` (the prompt's too when `echo`: scored by the
        engine, its first token None); `as_ids`: tokens written ``token_id:<id>``."""
        ids = gen.output_ids
        values: list[float | None] = list(gen.logprobs or [])
        if echo:
            ids = prompt + ids
            values = [None, *(await self.engine.score(prompt[:1], prompt[1:])), *values]
        tokens = [
            f"token_id:{t}" if as_ids else self.tok.decode([t], skip_special_tokens=False)
            for t in ids
        ]
        at = [sum(len(s) for s in tokens[:k]) for k in range(len(tokens))]
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": None, "text_offset": at}

    def _counted(self, request: web.Request) -> GatewayEpisode | None:
        """`_episode_of` a model call, counted as it arrives (answered or not)."""
        ep = self._episode_of(request)
        if ep is not None:
            ep.n_calls += 1
        return ep

    def _episode_of(self, request: web.Request) -> GatewayEpisode | None:
        ep = self._episodes.get(_credential(request))
        if ep is None and self.require_episode:
            raise ApiError(
                "unknown credential: use the key (or the /e/<key>/v1 base URL) of a "
                "running episode",
                status=401,
                type="invalid_api_key",
                code="invalid_api_key",
            )
        return ep

    def _completion_prompts(self, raw: object) -> list[list[int]]:
        if isinstance(raw, str) or _ids(raw):
            raw = [raw]
        if isinstance(raw, list) and raw and all(isinstance(p, str) for p in raw):
            return [list(self.tok.encode(p)) for p in raw]
        if isinstance(raw, list) and raw and all(_ids(p) for p in raw):
            return [list(p) for p in raw]
        raise ApiError(
            "prompt must be a string, a list of strings, a list of token ids or a list "
            "of lists of token ids",
            param="prompt",
        )

    async def _generate(
        self,
        body: Json,
        prompts: list[list[int]],
        ep: GatewayEpisode | None,
        request: web.Request,
        parse_tools: bool = False,
        *,
        echo: bool = False,
        opening: Opening = Opening(),
        grammar: str = "",
    ) -> _Call:
        """Generate (n per prompt), cut at stop strings, record; streamed as ids arrive (finish
        chunks are the caller's). A client gone first aborts it, unrecorded (`StreamClosed`).
        A forced call's `opening`: no text until the end, its close a stop string kept in it."""
        n = opt(body, "n", int, 1, MAX_N, 1)
        close = opening.close
        stops = stop_strings(body.get("stop")) + ([close] if close else [])
        params = msgspec.structs.replace(self._sampling(body, prompts), grammar=grammar)
        expanded = [p for p in prompts for _ in range(n)]
        skip_special = bool(opt(body, "skip_special_tokens", bool, None, None, True))
        chat = "messages" in body
        kind = "chatcmpl" if chat else "cmpl"  # OpenAI's id prefixes
        call = _Call(
            prompts=expanded, n=n, request_id=f"{kind}-{new_id()}", created=int(time.time())
        )

        def decode(ids: list[int]) -> str:
            return self.tok.decode(ids, skip_special_tokens=skip_special)

        held = bool(opening.prefill)  # a forced call's text goes out at the end
        texts = [TextStream(decode, stops, parse_tools, held=held) for _ in expanded]
        if body.get("stream"):  # the chunks of each choice, sent as its text arrives
            base = {"id": call.request_id, "created": call.created}
            base["model"] = body.get("model") or self.model_name
            base["object"] = "chat.completion.chunk" if chat else "text_completion"
            call.streams = ChoiceStreams(
                request,
                base,
                texts,
                chat=chat,
                usage=include_usage(body),
                heads=[self.tok.decode(p) for p in call.prompts] if echo else None,
                token_ids=bool(body.get("return_token_ids")),
            )
        gens = await self._run(call, params, texts if stops else None)
        call.outputs = [cut_at_stop(decode, gen, stops, keep=close) for gen in gens]
        if ep is not None:
            await ep.record(
                [g for g, _, _ in call.outputs],
                call.prompts,
                engine=f"gateway:{self.engine.name}",
                request_id=call.request_id,
                request_json=_debug_json(body),
            )
        return call

    async def _run(
        self, call: _Call, params: SamplingParams, texts: list[TextStream] | None
    ) -> list[Generation]:
        """The engine's generations (`texts`: cut at stop strings as they stream). Raises its
        refusal as an ApiError (into the stream once 200 is sent), or `StreamClosed`."""
        try:
            gens = await run_choices(self.engine, call.prompts, params, call.streams, texts)
        except EngineError as exc:
            err = ApiError(f"the engine refused the request: {exc}")
            if call.streams is not None and call.streams.resp is not None:  # 200 already sent
                raise await call.streams.error(err.json()) from exc
            raise err from exc
        if call.streams is not None and not call.streams.connected:
            raise StreamClosed(call.streams.resp)  # nobody saw this reply: not recorded
        return gens

    def _sampling(self, body: Json, prompts: list[list[int]]) -> SamplingParams:
        """The engine's sampling parameters for a body (limits checked, penalties refused)."""
        max_key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        longest = max(len(p) for p in prompts)
        if longest >= self.max_len:
            raise ApiError(
                f"the prompt is {longest} tokens; this model's context is {self.max_len}",
                param="messages" if "messages" in body else "prompt",
                code="context_length_exceeded",
            )
        max_new = opt(body, max_key, int, 1, None, None)
        if max_new is not None and longest + max_new > self.max_len:  # as vLLM and OpenAI answer
            raise ApiError(
                f"{max_key} is {max_new} and the prompt {longest} tokens: {longest + max_new} "
                f"in all, beyond this model's context of {self.max_len} tokens "
                f"({max_key} <= {self.max_len - longest} here)",
                param=max_key,
                code="context_length_exceeded",
            )
        extra_stops = opt(body, "stop_token_ids", list, None, None, [])
        if not all(isinstance(t, int) for t in extra_stops):
            raise ApiError("stop_token_ids must be a list of token ids", param="stop_token_ids")
        for key in ("frequency_penalty", "presence_penalty"):
            if opt(body, key, float, -2.0, 2.0, 0.0):
                raise ApiError(f"{key} != 0 is not supported", param=key)
        if body.get("logit_bias"):
            raise ApiError("logit_bias is not supported", param="logit_bias")
        return SamplingParams(
            max_new_tokens=max_new or min(self.default_max_tokens, self.max_len - longest),
            temperature=opt(body, "temperature", float, 0.0, 2.0, 1.0),
            top_p=opt(body, "top_p", float, 0.0, 1.0, 1.0) or 1.0,
            top_k=opt(body, "top_k", int, -1, None, -1),
            stop_token_ids=sorted(set(self.stop_ids) | set(extra_stops)),
            seed=opt(body, "seed", int, None, None, None),
            ignore_eos=bool(opt(body, "ignore_eos", bool, None, None, False)),
        )


class _Call:
    """One request's generations (n per prompt), cut at stop strings."""

    def __init__(self, *, prompts: list[list[int]], n: int, request_id: str, created: int) -> None:
        self.prompts, self.n, self.request_id, self.created = prompts, n, request_id, created
        self.outputs: list[tuple[Generation, str, bool]] = []  # cut at stop strings: text, cut
        self.streams: ChoiceStreams | None = None


_Reply = tuple[Json, _Call, list[str]]  # the answer, its call, each choice's final text


def _choice(call: _Call, i: int, fields: Json) -> Json:
    gen, _, stopped = call.outputs[i]
    return {
        "index": i,
        "finish_reason": "stop" if stopped or gen.finish_reason == "stop" else "length",
        **fields,
        "token_ids": gen.output_ids,
        "prompt_token_ids": call.prompts[i],
        "weight_version": gen.weight_version,
    }


def _ids(raw: object) -> bool:
    return isinstance(raw, list) and bool(raw) and all(isinstance(t, int) for t in raw)


def _envelope(kind: str, call: _Call, choices: list[Json], model: str) -> Json:
    n_in = sum(len(p) for p in call.prompts[:: call.n])  # each prompt once, not once per choice
    n_out = sum(len(g.output_ids) for g, _, _ in call.outputs)
    return {
        "id": call.request_id,
        "object": kind,
        "created": call.created,
        "model": model,
        "choices": choices,
        "system_fingerprint": None,
        "usage": {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out},
    }


def _credential(request: web.Request) -> str:
    """A request's episode credential: the URL's ``/e/<key>``, the bearer key or ``x-api-key``."""
    credential = request.match_info.get("credential")
    if credential is None:
        auth = request.headers.get("Authorization", "")
        credential = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
    return credential or request.headers.get("x-api-key", "").strip()


def _debug_json(body: Json) -> str:
    """`TurnGenerated.request_json`: the input and `tool_choice`, for a reader (training reads
    the ids, never this)."""
    keys = ("messages", "tools", "tool_choice", "prompt")
    return json.dumps({k: body[k] for k in keys if k in body})


@contextlib.asynccontextmanager
async def _serving(gateway: Gateway) -> AsyncIterator[web.AppRunner]:
    runner = web.AppRunner(gateway.app(), access_log=None)
    await runner.setup()
    try:
        yield runner
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def serve_unix(gateway: Gateway, path: str) -> AsyncIterator[str]:
    """Serve `gateway` on a unix socket at `path` (mode 0666: a container's non-root user may
    connect) until exit; yields the path."""
    async with _serving(gateway) as runner:
        await web.UnixSite(runner, path).start()
        os.chmod(path, 0o666)
        yield path


@contextlib.asynccontextmanager
async def serve_tcp(gateway: Gateway, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve `gateway` over TCP until exit; yields its base URL (``http://host:port/v1``)."""
    async with _serving(gateway) as runner:
        await web.TCPSite(runner, host, port).start()
        bound = runner.addresses[0][1] if runner.addresses else port
        yield f"http://{host}:{bound}/v1"

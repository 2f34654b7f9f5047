"""`stacx serve`: the in-process engine over HTTP, speaking SGLang's native subset (so that
`SGLangEngine` talks to it and to a real SGLang server alike) plus the model gateway's OpenAI and
Anthropic routes. Served alone, nothing is recorded (no run).
Routes: docs/engine.md#stacx-serve
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Sequence
from typing import Any, cast

from aiohttp import web

from stacx.errors import EngineError
from stacx.inference.gateway import Gateway
from stacx.inference.openai_api import Handler, Json, json_object, openai_errors
from stacx.inference.torch_engine import TorchEngine
from stacx.ports import ChatTokenizer, Generation, SamplingParams

# sampling_params keys accepted without effect when they hold their neutral value
_NEUTRAL = {
    "n": 1,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "stop": None,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "no_stop_trim": False,
    "min_new_tokens": 0,
}
_KNOWN = {
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop_token_ids",
    "ignore_eos",
    "sampling_seed",
    "seed",
    "ebnf",
}


class BadRequest(EngineError):
    """The request body is invalid (answered with HTTP 400)."""


def sampling_from_sglang(raw: Json) -> SamplingParams:
    """SGLang ``sampling_params`` -> :class:`SamplingParams`; unknown or unsupported keys fail."""
    for key, value in raw.items():
        if key not in _KNOWN and key not in _NEUTRAL:
            accepted = ", ".join(sorted(_KNOWN | set(_NEUTRAL)))
            raise BadRequest(f"sampling_params.{key} is unknown; accepted: {accepted}")
        if key in _NEUTRAL and value not in (_NEUTRAL[key], None, [], ""):
            raise BadRequest(f"sampling_params.{key}={value!r} is not supported here")
    seed = raw.get("sampling_seed", raw.get("seed"))
    try:
        return SamplingParams(
            max_new_tokens=int(raw.get("max_new_tokens", 128)),
            temperature=float(raw.get("temperature", 1.0)),
            top_p=float(raw.get("top_p", 1.0)),
            top_k=int(raw.get("top_k", -1)),
            stop_token_ids=[int(t) for t in raw.get("stop_token_ids") or []],
            seed=None if seed is None else int(seed),
            ignore_eos=bool(raw.get("ignore_eos", False)),
            grammar=str(raw.get("ebnf") or ""),  # llguidance's Lark form (stacx.inference.guided)
        )
    except (TypeError, ValueError) as e:
        raise BadRequest(f"sampling_params: {e}") from e


def finish_reason_json(gen: Generation) -> Json:
    if gen.finish_reason == "stop":
        return {"type": "stop", "matched": gen.output_ids[-1] if gen.output_ids else None}
    if gen.finish_reason == "length":
        return {"type": "length", "length": len(gen.output_ids)}
    return {"type": "abort", "message": "aborted"}


def served_aliases(model_path: str, extra: Sequence[str]) -> list[str]:
    """The names a served checkpoint also answers to: `extra`, its path, its directory name."""
    path = model_path.rstrip("/")
    return [*extra, *([path, os.path.basename(path)] if path else [])]


class Server:
    """The aiohttp application around one :class:`TorchEngine`."""

    def __init__(
        self, engine: TorchEngine, model_name: str = "default", aliases: Sequence[str] = ()
    ) -> None:
        """`model_name`, `aliases` (and the checkpoint's path and directory name): the names OpenAI
        requests may ask for; any other is a 404 model_not_found."""
        self.engine, self.model_name = engine, model_name
        self.loras: dict[str, str] = {}  # SGLang's loaded adapters: name -> path
        self.merged: str | None = None  # the one the engine serves (merged into its weights)
        self.app = web.Application(
            client_max_size=256 * 1024**2, middlewares=[_errors, openai_errors]
        )
        r = self.app.router
        r.add_post("/generate", self.generate)
        r.add_post("/update_weights_from_disk", self.update_weights)
        r.add_post("/flush_cache", self.flush_cache)
        r.add_post("/load_lora_adapter", self.load_lora)
        r.add_post("/unload_lora_adapter", self.unload_lora)
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health)
        r.add_get("/get_model_info", self.model_info)
        r.add_get("/get_weight_version", self.weight_version)
        if engine.tokenizer is not None:  # the OpenAI routes need the chat template
            self.gateway = Gateway(
                engine,
                cast(ChatTokenizer, engine.tokenizer),
                model_name=model_name,
                aliases=served_aliases(engine.model_path, aliases),
                max_len=engine.max_len,
            )
            self.gateway.add_routes(r)

    def _prompts(self, body: Json, ids_key: str, text_key: str) -> tuple[list[list[int]], bool]:
        """(prompts, single) from token ids or text, one prompt or a list of them."""
        raw = body.get(ids_key)
        if raw is None and text_key in body:
            text = body[text_key]
            texts = [text] if isinstance(text, str) else text
            if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                raise BadRequest(f"{text_key} must be a string or a list of strings")
            tok: Any = self.engine.tokenizer
            if tok is None:
                raise BadRequest("this engine has no tokenizer: send token ids")
            return [list(tok.encode(t)) for t in texts], isinstance(text, str)
        if not isinstance(raw, list) or not raw:
            raise BadRequest(f"{ids_key} must be a non-empty list of token ids (or of lists)")
        single = all(isinstance(t, int) for t in raw)
        prompts = [raw] if single else raw
        if not all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prompts):
            raise BadRequest(f"{ids_key} must be a list of ints or a list of lists of ints")
        return prompts, single

    async def _prompt_logprobs(self, ids: list[int], start: int) -> list[float | None]:
        """logprob of ids[p] given ids[:p] for p in [start >= 0, len); None at p = 0."""
        head: list[float | None] = [None] if start == 0 else []
        lo = max(1, start)
        return head + (list(await self.engine.score(ids[:lo], ids[lo:])) if lo < len(ids) else [])

    # ---- native routes ------------------------------------------------------------------------

    async def generate(self, request: web.Request) -> web.Response:
        body = await json_object(request)
        if body.get("stream"):
            raise BadRequest("stream=true is not supported by stacx serve")
        prompts, single = self._prompts(body, "input_ids", "text")
        self._check_lora(body.get("lora_path"), len(prompts))
        params = sampling_from_sglang(body.get("sampling_params") or {})
        t0 = time.monotonic()
        gens = await self.engine.generate(prompts, params)
        want_lp = bool(body.get("return_logprob"))
        start = body.get("logprob_start_len", -1)
        tok: Any = self.engine.tokenizer
        out = []
        for prompt, gen in zip(prompts, gens, strict=True):
            meta: Json = {
                "id": uuid.uuid4().hex,
                "finish_reason": finish_reason_json(gen),
                "prompt_tokens": len(prompt),
                "completion_tokens": len(gen.output_ids),
                "cached_tokens": 0,
                "weight_version": str(gen.weight_version),
                "e2e_latency": time.monotonic() - t0,
            }
            if want_lp:
                meta["output_token_logprobs"] = [
                    [lp, t, None] for lp, t in zip(gen.logprobs or [], gen.output_ids, strict=True)
                ]
                if isinstance(start, int) and start >= 0:
                    lps = await self._prompt_logprobs(prompt, start)
                    meta["input_token_logprobs"] = [
                        [lp, t, None] for lp, t in zip(lps, prompt[start:], strict=True)
                    ]
            text = "" if tok is None else str(tok.decode(gen.output_ids))
            out.append({"text": text, "output_ids": gen.output_ids, "meta_info": meta})
        return web.json_response(out[0] if single else out)

    def _check_lora(self, names: object, n: int) -> None:
        """SGLang's ``lora_path`` (a name, or one per prompt) must name the one merged adapter."""
        want = names if isinstance(names, list) else [names] * n
        if any(name != self.merged for name in want):
            raise BadRequest(
                f"lora_path {names!r}: this server serves {self.merged or 'the base model'} "
                "(one adapter at a time, merged into the weights)"
            )

    async def load_lora(self, request: web.Request) -> web.Response:
        """SGLang's ``/load_lora_adapter``: merge the PEFT directory in, as the next version."""
        body = await json_object(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise BadRequest("lora_name and lora_path (an adapter directory) are required")
        try:
            await self.engine.load_adapter(path, self.engine.weight_version + 1)
        except EngineError as e:
            return self._lora_answer(str(e))
        self.loras[name], self.merged = path, name
        return self._lora_answer()

    async def unload_lora(self, request: web.Request) -> web.Response:
        """SGLang's ``/unload_lora_adapter``: the merged adapter's goes, the base comes back."""
        body = await json_object(request)
        name = body.get("lora_name")
        if name not in self.loras:
            return self._lora_answer(f"adapter {name!r} is not loaded")
        path = self.loras.pop(str(name))
        if name == self.merged:  # an empty adapter: every adapted weight gets its base back
            await self.engine.load_adapter(path, self.engine.weight_version + 1, {})
            self.merged = None
        return self._lora_answer()

    def _lora_answer(self, error: str = "") -> web.Response:
        body = {"success": not error, "error_message": error, "loaded_adapters": self.loras}
        return web.json_response(body, status=400 if error else 200)

    async def update_weights(self, request: web.Request) -> web.Response:
        body = await json_object(request)
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            raise BadRequest("model_path (a safetensors file or directory) is required")
        raw = body.get("weight_version")
        try:
            version = self.engine.weight_version + 1 if raw in (None, "") else int(raw)
        except (TypeError, ValueError) as e:
            raise BadRequest(f"weight_version must hold an integer, got {raw!r}") from e
        try:
            await self.engine.load_weights(path, version)
        except EngineError as e:
            return web.json_response({"success": False, "message": str(e)}, status=400)
        message = f"loaded {path} as version {version}"
        return web.json_response({"success": True, "message": message, "num_paused_requests": 0})

    async def flush_cache(self, request: web.Request) -> web.Response:
        await self.engine.flush_cache()
        return web.Response(text="Cache flushed.\n")

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def model_info(self, request: web.Request) -> web.Response:
        path, version = self.engine.model_path, str(self.engine.weight_version)
        info = {"model_path": path, "tokenizer_path": path, "is_generation": True}
        return web.json_response(
            {**info, "weight_version": version, "max_len": self.engine.max_len}
        )

    async def weight_version(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": str(self.engine.weight_version)})


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except EngineError as e:  # bad input or a refused request: the message names the cause
        return web.json_response(
            {"error": {"message": str(e), "type": type(e).__name__}}, status=400
        )

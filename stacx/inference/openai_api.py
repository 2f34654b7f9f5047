"""The OpenAI HTTP API's request side as the gateway accepts it: the accepted keys, validation
naming the offending field, and the OpenAI-shaped error answer (``error.param``), in one place.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

Json = dict[str, Any]
MAX_N = 16
CHAT_KEYS = {
    "model",
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "n",
    "stop",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "seed",
    "logprobs",
    "top_logprobs",
    "stream",
    "stream_options",
    "user",
    "metadata",
    "store",
    "frequency_penalty",
    "presence_penalty",
    "response_format",
    "top_k",
    "stop_token_ids",
    "ignore_eos",
    "logit_bias",
    "skip_special_tokens",
    # vLLM's extension: each choice carries token_ids and prompt_token_ids (`shown`)
    "return_token_ids",
    # opaque hints with no effect on what is generated (OpenHands sends prompt_cache_key)
    "prompt_cache_key",
    "safety_identifier",
}
COMPLETION_KEYS = (
    CHAT_KEYS
    - {
        "messages",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_completion_tokens",
        "top_logprobs",
        "response_format",
        "store",
        "metadata",
    }
) | {"prompt", "echo", "suffix", "best_of", "return_tokens_as_token_ids"}


TOKEN_ID_KEYS = ("token_ids", "prompt_token_ids")


def shown(out: Json, body: Json) -> Json:
    """An answer as it is sent: each choice's ``token_ids`` and ``prompt_token_ids`` only when
    the request asked (``return_token_ids``, as vLLM names it); the gateway keeps them inside."""
    if body.get("return_token_ids"):
        return out
    return {
        **out,
        "choices": [{k: v for k, v in c.items() if k not in TOKEN_ID_KEYS} for c in out["choices"]],
    }


class ApiError(Exception):
    """An OpenAI-shaped error answer: HTTP `status`, the offending field in `param`."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        status: int = 400,
        type: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.status = message, status
        self.error = {"message": message, "type": type, "param": param, "code": code}

    def json(self) -> Json:
        return {"error": self.error}


async def json_object(request: web.Request) -> Json:
    """The request's JSON object body; ApiError (400) for anything else."""
    try:
        body = await request.json()
    except ValueError as exc:
        raise ApiError(f"the request body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    return body


async def request_body(request: web.Request, accepted: set[str]) -> Json:
    body = await json_object(request)
    unknown = sorted(set(body) - accepted)
    if unknown:
        raise ApiError(
            f"unrecognized request argument: {unknown[0]}; accepted: {', '.join(sorted(accepted))}",
            param=unknown[0],
        )
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise ApiError("model must be a string", param="model")
    opt(body, "stream", bool, None, None, False)
    return body


def opt(body: Json, key: str, kind: type, lo: float | None, hi: float | None, default: Any) -> Any:
    """body[key] checked for type and range (None or absent: `default`)."""
    value = body.get(key)
    if value is None:
        return default
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise ApiError(f"{key} must be a {kind.__name__}, got {value!r}", param=key)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"[{'' if lo is None else lo}, {'' if hi is None else hi}]"
        raise ApiError(f"{key}={value!r} is out of range {bounds}", param=key)
    return value


def stop_strings(raw: object) -> list[str]:
    if raw is None:
        return []
    out = [raw] if isinstance(raw, str) else raw
    if not isinstance(out, list) or len(out) > 4 or not all(isinstance(s, str) and s for s in out):
        raise ApiError("stop must be a non-empty string or a list of up to 4 of them", param="stop")
    return out


def request_tools(body: Json) -> list[Json]:
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ApiError("tools must be a list", param="tools")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name or t.get("type") != "function":
            raise ApiError(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., "
                "'parameters': {...}}}}",
                param=f"tools[{i}]",
            )
    return tools


def content_text(content: object, where: str, role: str, item: str = "[{}]") -> str:
    """A string, or a list of text parts joined (`item`: how a part's path follows `where`)."""
    if content is None:
        if role in ("assistant", "tool"):
            return ""
        raise ApiError(f"{where} is required for a {role} message", param=where)
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(f"{where} must be a string or a list of text parts", param=where)
    for k, p in enumerate(content):
        if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
            at = where + item.format(k)
            raise ApiError(
                f"{at}: only text parts ({{'type': 'text', 'text': ...}}) are supported", param=at
            )
    return "".join(p["text"] for p in content)


def tool_call_json(call_id: str, name: str, arguments: object) -> Json:
    return {"type": "function", "id": call_id, "function": {"name": name, "arguments": arguments}}


def assistant_calls(raw: object, where: str) -> list[tuple[str, str, dict[str, object]]]:
    if not isinstance(raw, list):
        raise ApiError(f"{where} must be a list", param=where)
    calls = []
    for k, c in enumerate(raw):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ApiError(
                f"{where}[{k}] must hold function.name and function.arguments",
                param=f"{where}[{k}]",
            )
        args, at = fn.get("arguments") or "{}", f"{where}[{k}].function.arguments"
        try:
            parsed = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError as exc:
            raise ApiError(f"{at} is not JSON: {exc}", param=at) from exc
        if not isinstance(parsed, dict):
            raise ApiError(f"{at} must be a JSON object", param=at)
        calls.append((str(c.get("id") or ""), fn["name"], parsed))
    return calls


def include_usage(body: Json) -> bool:
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict) or set(opts) - {"include_usage", "continuous_usage_stats"}:
        raise ApiError("stream_options accepts include_usage", param="stream_options")
    return bool(opts.get("include_usage"))


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """ApiError -> its OpenAI-shaped JSON; an unknown route -> a 404 in the same shape."""
    try:
        return await handler(request)
    except ApiError as e:
        return web.json_response(e.json(), status=e.status)
    except web.HTTPNotFound:
        err = ApiError(f"no route {request.method} {request.path}", status=404, code="not_found")
        return web.json_response(err.json(), status=404)

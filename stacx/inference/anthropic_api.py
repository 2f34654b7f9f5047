"""Anthropic's Messages API (``POST /v1/messages``) as the model gateway speaks it: translated to
the gateway's one chat path (recorded as ``/v1/chat/completions`` is) and back. Errors are
Anthropic-shaped and name the field; what it does not support is refused, never ignored.
Design: docs/scaffolds.md#anthropic-messages-api
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from stacx.inference.openai_api import ApiError, Handler, Json, content_text, tool_call_json
from stacx.inference.streaming import sse, sse_response

KEYS = {
    "model",
    "messages",
    "system",
    "max_tokens",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "metadata",
    "thinking",
    "output_config",
    # hints with no effect on what is generated here
    "service_tier",
    "cache_control",
    "container",
    "diagnostics",
    "inference_geo",
    "speed",
    "user_profile_id",
    "workspace_id",
}
# Anthropic's error types of the statuses the gateway answers with (ApiError's)
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}
STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens", "stop": "end_turn"}


def chat_body(raw: Json) -> Json:
    """The OpenAI chat request of an Anthropic Messages request (ApiError naming the field)."""
    unknown = sorted(set(raw) - KEYS)
    if unknown:
        raise ApiError(
            f"{unknown[0]}: Extra inputs are not permitted; accepted: {', '.join(sorted(KEYS))}",
            param=unknown[0],
        )
    max_tokens = raw.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ApiError("max_tokens: a positive integer is required", param="max_tokens")
    if raw.get("thinking") not in (None, {"type": "disabled"}):
        raise ApiError("thinking: only {'type': 'disabled'} is supported", param="thinking")
    output = raw.get("output_config")
    if output is not None and (not isinstance(output, dict) or output.get("format") is not None):
        raise ApiError(
            "output_config.format (structured output) is not supported", param="output_config"
        )
    stops = raw.get("stop_sequences") or []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise ApiError("stop_sequences must be a list of non-empty strings", param="stop_sequences")
    system = raw.get("system")
    messages = [] if system in (None, "", []) else [_text(system, "system", "system")]
    if not isinstance(raw.get("messages"), list) or not raw["messages"]:
        raise ApiError("messages: a non-empty list is required", param="messages")
    for i, m in enumerate(raw["messages"]):
        messages += _turn(m, f"messages.{i}")
    if not isinstance(raw.get("stream", False), bool):
        raise ApiError("stream must be a boolean", param="stream")
    # streamed or not, the chat path generates the whole reply (see the module's limits)
    body: Json = {"model": raw.get("model"), "messages": messages, "max_tokens": max_tokens}
    if stops:
        body["stop"] = stops
    body.update({k: raw[k] for k in ("temperature", "top_p", "top_k") if raw.get(k) is not None})
    tools = raw.get("tools")
    if tools:
        body["tools"] = [_tool(t, f"tools.{k}") for k, t in enumerate(_list(tools, "tools"))]
    if raw.get("tool_choice") is not None:
        body["tool_choice"] = _tool_choice(raw["tool_choice"])
    return body


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ApiError(f"{where}: a list is required", param=where)
    return value


def _text(content: object, where: str, role: str) -> Json:
    """A message of a string or of text blocks joined (``cache_control`` and citations ignored)."""
    return {"role": role, "content": content_text(content, where, role, item=".{}")}


def _turn(m: object, where: str) -> list[Json]:
    """One Anthropic message as OpenAI chat messages: an assistant turn's tool_use blocks become
    its tool_calls; a user turn's tool_result blocks become tool messages (before its text)."""
    if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
        raise ApiError(f"{where}.role must be 'user' or 'assistant'", param=f"{where}.role")
    role, content = m["role"], m.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    texts: list[str] = []
    calls: list[Json] = []
    results: list[Json] = []
    for k, block in enumerate(_list(content, f"{where}.content")):
        at = f"{where}.content.{k}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("input"), dict):
                raise ApiError(f"{at}: a tool_use block needs name and input (an object)", param=at)
            call_id, args = str(block.get("id") or ""), json.dumps(block["input"])
            calls.append(tool_call_json(call_id, block["name"], args))
        elif kind == "tool_result" and role == "user":
            result = _text(block.get("content") or "", f"{at}.content", "tool")
            if block.get("is_error"):
                result["content"] = f"Error: {result['content']}"
            results.append({**result, "tool_call_id": str(block.get("tool_use_id") or "")})
        else:
            other = "tool_use" if role == "assistant" else "tool_result"
            raise ApiError(
                f"{at}: a {role} message's blocks may be text, {other}; got {kind!r}", param=at
            )
    out = list(results)
    if calls:
        out.append({"role": "assistant", "content": "".join(texts) or None, "tool_calls": calls})
    elif texts or not results:
        out.append({"role": role, "content": "".join(texts)})
    return out


def _tool(t: object, where: str) -> Json:
    if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"]:
        raise ApiError(f"{where}: a tool needs a name and an input_schema", param=where)
    schema = t.get("input_schema") or {"type": "object", "properties": {}}
    fn = {"name": t["name"], "description": t.get("description") or "", "parameters": schema}
    return {"type": "function", "function": fn}


def _tool_choice(choice: object) -> object:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(choice, dict) and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ApiError(
        "tool_choice must be {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', "
        f"'name': ...}}; got {choice!r}",
        param="tool_choice",
    )


def message(out: Json, stops: list[str], decode: Callable[[list[int]], str]) -> Json:
    """The Anthropic message of a chat answer's first choice (`decode` finds its stop sequence)."""
    choice = out["choices"][0]
    msg = choice["message"]
    blocks: list[Json] = [{"type": "text", "text": msg["content"]}] if msg.get("content") else []
    for c in msg.get("tool_calls") or []:
        tool = {"type": "tool_use", "id": c["id"], "name": c["function"]["name"]}
        blocks.append({**tool, "input": json.loads(c["function"]["arguments"])})
    reason, matched = STOP_REASONS[choice["finish_reason"]], None
    if reason == "end_turn" and stops:
        text = decode(choice["token_ids"])
        hits = sorted((text.find(s), s) for s in stops if s in text)
        if hits:
            reason, matched = "stop_sequence", hits[0][1]
    usage = out["usage"]
    return {
        "id": "msg_" + out["id"].removeprefix("chatcmpl-"),
        "type": "message",
        "role": "assistant",
        "model": out["model"],
        "content": blocks,
        "stop_reason": reason,
        "stop_sequence": matched,
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
        },
    }


def stream_events(msg: Json) -> list[tuple[str, Json]]:
    """A whole message as Anthropic's stream events, in their order."""
    ends = {"stop_reason": msg["stop_reason"], "stop_sequence": msg["stop_sequence"]}
    head = {**msg, "content": [], "stop_reason": None, "stop_sequence": None}
    head["usage"] = {**msg["usage"], "output_tokens": 0}
    events: list[tuple[str, Json]] = [("message_start", {"message": head}), ("ping", {})]
    for i, block in enumerate(msg["content"]):
        start: Json = {"type": "text", "text": ""}
        delta: Json = {"type": "text_delta", "text": block.get("text")}
        if block["type"] == "tool_use":
            start = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events += [
            ("content_block_start", {"index": i, "content_block": start}),
            ("content_block_delta", {"index": i, "delta": delta}),
            ("content_block_stop", {"index": i}),
        ]
    usage = {"output_tokens": msg["usage"]["output_tokens"]}
    return [*events, ("message_delta", {"delta": ends, "usage": usage}), ("message_stop", {})]


async def send_stream(request: web.Request, msg: Json) -> web.StreamResponse:
    """Send `msg` as an SSE stream of Anthropic's events."""
    resp = await sse_response(request)
    for name, data in stream_events(msg):
        await resp.write(sse({"type": name, **data}, event=name))
    await resp.write_eof()
    return resp


def anthropic_errors(handler: Handler) -> Handler:
    """`handler` whose ApiErrors are answered in Anthropic's error shape."""

    async def route(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as e:
            error = {"type": ERROR_TYPES.get(e.status, "api_error"), "message": e.message}
            return web.json_response({"type": "error", "error": error}, status=e.status)

    return route

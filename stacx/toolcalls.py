"""The Hermes/Qwen tool-call format (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` in
a plain assistant message), written and parsed, for the SWE agent and the model gateway. A fenced
```bash block with no <tool_call> is taken as a bash call (weak models). Guarantees: the parsers
never raise; a malformed call's `error` is written for the model; only a message's first call is
taken; argument types are checked by `stacx.agents.tools`, not here.
"""

from __future__ import annotations

import json
import re

import msgspec

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"

_FENCE = re.compile(r"```(?:bash|sh|shell|console)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
_JSON_FENCE = re.compile(r"^```(?:json)?\s*\n?(.*?)\n?```$", re.DOTALL)


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    arguments: dict[str, object] = msgspec.field(default_factory=dict)
    extra_calls: int = 0  # further calls in the same message, ignored (the model is told)


class MalformedCall(msgspec.Struct, frozen=True, kw_only=True):
    error: str  # an explanation addressed to the model
    raw: str  # the offending text, for the log


def render_tool_call(name: str, arguments: dict[str, object]) -> str:
    """The canonical text of one call (what the oracle "says" and the system prompt shows)."""
    return f"{OPEN_TAG}{json.dumps({'name': name, 'arguments': arguments})}{CLOSE_TAG}"


def parse_action(text: str) -> ToolCall | MalformedCall | None:
    """The first tool call in an assistant message: a `ToolCall`, a `MalformedCall`, or None."""
    start = text.find(OPEN_TAG)
    if start < 0:
        fence = _FENCE.search(text)
        if fence is None:
            return None
        command = fence.group(1).strip()
        if not command:
            return MalformedCall(error="The ```bash block is empty.", raw=fence.group(0))
        return ToolCall(name="bash", arguments={"command": command})
    body_start = start + len(OPEN_TAG)
    end = text.find(CLOSE_TAG, body_start)
    # An unterminated call (the model ran out of tokens, or stopped right before the close
    # tag) is still parsed: the JSON itself tells whether it is complete.
    body = text[body_start:] if end < 0 else text[body_start:end]
    rest = "" if end < 0 else text[end + len(CLOSE_TAG) :]
    call = _parse_body(body.strip())
    if isinstance(call, ToolCall) and OPEN_TAG in rest:
        call = ToolCall(name=call.name, arguments=call.arguments, extra_calls=rest.count(OPEN_TAG))
    return call


def _parse_body(body: str) -> ToolCall | MalformedCall:
    fenced = _JSON_FENCE.match(body)
    if fenced is not None:
        body = fenced.group(1).strip()
    if not body:
        return MalformedCall(error="The <tool_call> is empty.", raw=body)
    brace = body.find("{")
    if brace < 0:
        return MalformedCall(
            error='The <tool_call> must hold a JSON object like {"name": ..., "arguments": {...}}.',
            raw=body,
        )
    try:
        # raw_decode tolerates trailing text after the object (a common weak-model habit).
        obj, _ = json.JSONDecoder().raw_decode(body[brace:])
    except json.JSONDecodeError as exc:
        return MalformedCall(error=f"The <tool_call> is not valid JSON: {exc}.", raw=body)
    if not isinstance(obj, dict):
        return MalformedCall(error="The <tool_call> JSON must be an object.", raw=body)
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return MalformedCall(error='The <tool_call> JSON needs a string "name".', raw=body)
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        # Some templates double-encode arguments as a JSON string.
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return MalformedCall(error=f'"arguments" is a string but not JSON: {exc}.', raw=body)
    if not isinstance(arguments, dict):
        return MalformedCall(error='"arguments" must be a JSON object.', raw=body)
    return ToolCall(name=name, arguments={str(k): v for k, v in arguments.items()})


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """Every well-formed ``<tool_call>`` of a message and the text before the first (OpenAI
    ``tool_calls``); any malformed call gives ``(text, [])``, as vLLM's Hermes parser does."""
    start = text.find(OPEN_TAG)
    if start < 0:
        return text, []
    calls: list[ToolCall] = []
    pos = start
    while pos >= 0:
        end = text.find(CLOSE_TAG, pos)
        body = text[pos + len(OPEN_TAG) : None if end < 0 else end]
        call = _parse_body(body.strip())
        if isinstance(call, MalformedCall):
            return text, []
        calls.append(call)
        if end < 0:
            break
        pos = text.find(OPEN_TAG, end + len(CLOSE_TAG))
    return text[:start].rstrip(), calls


def tools_system_prompt(tools: list[dict[str, object]]) -> str:
    """The Hermes instructions presenting function schemas to a model whose chat template has no
    tools support (the text Qwen2.5's template writes)."""
    listing = "\n".join(json.dumps(t) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{listing}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        f"{OPEN_TAG}{CLOSE_TAG} XML tags:\n"
        f'{OPEN_TAG}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{CLOSE_TAG}'
    )

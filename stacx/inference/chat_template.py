"""The model's chat template, as the gateway uses it: forced tool calls (`ToolChoice`, an opening
read off a rendered call plus a grammar of its arguments), ``response_format`` grammars, a
request's messages (`template_messages`) and the ids that end a reply (`turn_stop_ids`).

JSON is held to json.dumps' layout, so a small model cannot wander in whitespace.
Design: docs/scaffolds.md#gateway-reference
"""

from __future__ import annotations

import functools
import json
import math
import random
from typing import NamedTuple

from stacx.inference.gateway_episode import GatewayEpisode
from stacx.inference.openai_api import (
    ApiError,
    Json,
    assistant_calls,
    content_text,
    tool_call_json,
)
from stacx.ports import ChatTokenizer
from stacx.toolcalls import render_tool_call, tools_system_prompt

# json.dumps' layout and no other whitespace (llguidance's x-guidance options for %json)
JSON_LAYOUT = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


def json_grammar(schema: Json, lead: str = "", tail: str = "") -> str:
    """An llguidance grammar (Lark form) of `lead`, then JSON valid under `schema`, then `tail`."""
    value = {**schema, "x-guidance": JSON_LAYOUT}
    parts = [json.dumps(lead)] if lead else []
    parts.append("value")
    parts += [json.dumps(tail)] if tail else []
    return f"start: {' '.join(parts)}\nvalue: %json {json.dumps(value)}\n"


def response_grammar(fmt: object) -> str:
    """The grammar of ``response_format`` (OpenAI's shapes): "" for none or text; any JSON
    object for json_object; the schema's JSON for json_schema."""
    if fmt is None or fmt == {"type": "text"}:
        return ""
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_object":
        return json_grammar({"type": "object"})
    spec = fmt.get("json_schema") if isinstance(fmt, dict) else None
    schema = spec.get("schema", {}) if isinstance(spec, dict) else None
    if kind == "json_schema" and isinstance(schema, dict):
        return json_grammar(schema)
    raise ApiError(
        "response_format must be {'type': 'text'}, {'type': 'json_object'} or "
        "{'type': 'json_schema', 'json_schema': {'name': N, 'schema': {...}}}; "
        f"got {fmt!r}",
        param="response_format",
    )


class Opening(NamedTuple):
    """How a forced call of `name` starts (`prefill`, ending before its arguments), the tag
    that ends it (`close`, a stop string), and what comes between: `lead` (whitespace before
    the arguments) and `tail` (the call's text after them, `close` included)."""

    prefill: str = ""
    close: str = ""
    name: str = ""
    lead: str = ""
    tail: str = ""

    def grammar(self, tools: list[Json]) -> str:
        """The rest of the reply, held to the call's shape and the tool's parameters schema."""
        [tool] = [t["function"] for t in tools if t["function"]["name"] == self.name][:1]
        schema = tool.get("parameters") or {"type": "object"}
        return json_grammar(schema, self.lead, self.tail)


class ToolChoice:
    """`tool_choice` -> the `Opening` a reply may start with, per function name, cached."""

    def __init__(self, tok: ChatTokenizer, native_tools: bool) -> None:
        self.tok, self.native_tools = tok, native_tools
        self._openings = functools.cache(self._opening)  # by function name

    def prefills(self, choice: object, tools: list[Json]) -> list[Opening]:
        """The openings a reply may be forced to start with: none for "auto" and "none", one for
        a named function or "required" of one tool, one per tool for "required" of several (the
        caller picks: `pick_function`)."""
        if choice in ("auto", "none"):
            return [Opening()]
        names = list(dict.fromkeys(t["function"]["name"] for t in tools))
        named = choice.get("function") if isinstance(choice, dict) else None
        if choice == "required":  # the calls a constrained decoder allows: one of each tool
            chosen = names
        elif (
            isinstance(choice, dict)
            and isinstance(named, dict)
            and choice.get("type") == "function"
            and named.get("name") in names
        ):
            chosen = [named["name"]]
        else:
            raise ApiError(
                "tool_choice must be 'auto', 'none', 'required' or {'type': "
                "'function', 'function': {'name': N}} with N one of the tools "
                f"({', '.join(names) or 'none given'}); got {choice!r}",
                param="tool_choice",
            )
        if not tools:
            raise ApiError(f"tool_choice {choice!r} needs tools", param="tool_choice")
        return [self._openings(name) for name in chosen]

    def _opening(self, name: str) -> Opening:
        """How this template's assistant turn starts a call of `name`, cut before its
        arguments, and what follows them: read off a rendered call."""
        mark = "STACXMARK"
        args = {mark: 0}
        if not self.native_tools:
            text = render_tool_call(name, dict(args))
        else:
            user = [{"role": "user", "content": "u"}]
            head = self.tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
            call = {
                "role": "assistant",
                "content": "",
                "tool_calls": [tool_call_json("call_0", name, args)],
            }
            full = self.tok.apply_chat_template([*user, call], tokenize=False)
            if not full.startswith(head):
                raise ApiError(
                    "tool_choice: this model's chat template does not render an "
                    "assistant tool call after its generation prompt",
                    param="tool_choice",
                )
            text = full[len(head) :]
        at = text.find(json.dumps(mark))
        close = text[at:].partition("}")[2].strip().lstrip("}").strip()
        brace = text.rfind("{", 0, at)
        if at < 0 or not close or brace < 0:
            raise ApiError(
                "tool_choice: cannot find where this model's tool call opens and closes",
                param="tool_choice",
            )
        end = text.index("}", at) + 1  # the arguments' object ends
        prefill = text[:brace].rstrip()
        return Opening(
            prefill=prefill,
            close=close,
            name=name,
            lead=text[len(prefill) : brace],
            tail=text[end : text.index(close, end) + len(close)],
        )


def pick_function(scores: list[float], temperature: float, seed: int | None) -> int:
    """Which forced opening (one per tool) a reply takes, from the model's log-probability of
    each: the likeliest at temperature 0, else drawn from softmax(scores / T) with `seed`."""
    if temperature == 0:
        return max(range(len(scores)), key=scores.__getitem__)
    top = max(scores)
    weights = [math.exp((s - top) / temperature) for s in scores]
    return random.Random(seed).choices(range(len(scores)), weights=weights)[0]


def template_messages(
    native_tools: bool, raw: object, tools: list[Json], ep: GatewayEpisode | None
) -> list[Json]:
    """A request's `messages` as the template's conversation: a call the model wrote replays as
    exactly what it wrote (`ep.raw_texts`); tools the template lacks go in STACX's text format."""
    if not isinstance(raw, list) or not raw:
        raise ApiError("messages must be a non-empty list of message objects", param="messages")
    out: list[Json] = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(f"{where} must be an object", param=where)
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise ApiError(
                f"{where}.role must be one of system, developer, user, assistant, "
                f"tool; got {role!r}",
                param=f"{where}.role",
            )
        content = content_text(m.get("content"), f"{where}.content", role)
        if role == "assistant" and m.get("tool_calls"):
            calls = assistant_calls(m["tool_calls"], f"{where}.tool_calls")
            raw_text = ep.raw_texts.get(tuple(c[0] for c in calls)) if ep else None
            if raw_text is not None:  # exactly what the model wrote
                out.append({"role": "assistant", "content": raw_text})
            elif native_tools:
                native = [tool_call_json(cid, name, args) for cid, name, args in calls]
                out.append({"role": "assistant", "content": content, "tool_calls": native})
            else:
                text = "\n".join(render_tool_call(name, args) for _, name, args in calls)
                out.append(
                    {"role": "assistant", "content": f"{content}\n{text}" if content else text}
                )
        elif role == "tool" and not native_tools:
            out.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
        else:
            msg: Json = {"role": "system" if role == "developer" else role, "content": content}
            if role == "tool" and "tool_call_id" in m:
                msg["tool_call_id"] = m["tool_call_id"]
            out.append(msg)
    if tools and not native_tools:
        head = tools_system_prompt(tools)
        if out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{head}"}
        else:
            out.insert(0, {"role": "system", "content": head})
    return out


def turn_stop_ids(tok: ChatTokenizer) -> list[int]:
    """EOS and the token that ends an assistant message in this template (ChatML: <|im_end|>)."""
    stops = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    marker = "\x00STACX\x00"
    try:
        text = tok.apply_chat_template(
            [{"role": "user", "content": "u"}, {"role": "assistant", "content": marker}],
            tokenize=False,
            add_generation_prompt=False,
        )
    except Exception:  # a template that cannot render this pair: EOS alone ends a reply
        return sorted(stops)
    close = text.partition(marker)[2].strip()  # what ends the assistant message
    stops.update(tok.encode(close, add_special_tokens=False)[:1] if close else [])
    return sorted(stops)

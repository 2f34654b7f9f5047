"""The model's chat template, as the gateway uses it: for `tool_choice`, for a request's
messages (`template_messages`) and for the ids that end a reply (`turn_stop_ids`).

`ToolChoice.prefills` gives what a reply is forced to start with for "required" or a named
function: the template's own tool-call opening up to the arguments (Hermes:
``<tool_call>\n{"name": "bash", "arguments":``), read off a call the template renders (so it works
for any template that renders assistant tool calls, and for STACX's text format where the
template has none); for "required" of several tools, one per tool, and the gateway picks among
them by the model's scores (`pick_function`). `Opening.grammar` then holds the rest of the reply
to the call's shape: the arguments as JSON valid under the tool's schema, then the call's
closing text, decoded under that grammar by an engine that constrains (`SamplingParams.grammar`).
`response_grammar` does the same for ``response_format`` json_object / json_schema.

JSON is constrained to json.dumps' layout (``", "`` and ``": "``, no other whitespace), as the
templates render calls: a small model cannot then wander in whitespace until its token limit.
Limits: an engine without grammars gets the prefill alone (the arguments are the model's, and a
reply that is not a well-formed call stays text); a reply cut by its token limit is a prefix.
"""

from __future__ import annotations

import json
import math
import random
from typing import NamedTuple

from stacx.inference.gateway_episode import GatewayEpisode
from stacx.inference.openai_api import ApiError, Json, assistant_calls, content_text
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
    if (
        kind == "json_schema"
        and isinstance(spec, dict)
        and isinstance(spec.get("schema", {}), dict)
    ):
        return json_grammar(spec.get("schema") or {})
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
        self._openings: dict[str, Opening] = {}

    def prefills(self, choice: object, tools: list[Json]) -> list[Opening]:
        """What the reply may be forced to start with for `tool_choice` (see `Opening`): nothing
        for "auto" and "none"; the model's tool-call opening up to the arguments for a named
        function ({"type": "function", "function": {"name": ...}}) and for "required" of one
        tool; for "required" of several tools, that opening for each of them (the caller picks
        one: `pick_function`). The rest of the reply is decoded under `Opening.grammar`; the
        reply ends at the call's closing tag (a stop string) either way."""
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
        for name in chosen:
            if name not in self._openings:
                self._openings[name] = self._opening(name)
        return [self._openings[name] for name in chosen]

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
            full = self.tok.apply_chat_template(
                [
                    *user,
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "type": "function",
                                "id": "call_0",
                                "function": {"name": name, "arguments": args},
                            }
                        ],
                    },
                ],
                tokenize=False,
            )
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
    """Which of several forced openings (one per tool, `ToolChoice.prefills`) a reply takes,
    given the model's log-probability of each after the prompt: the likeliest at temperature 0,
    else one drawn from the model's distribution restricted to the tools (softmax of
    scores / temperature, seeded by the request's seed). What a constrained decoder does at the
    function's name, done for the whole name at once."""
    if temperature == 0:
        return max(range(len(scores)), key=scores.__getitem__)
    top = max(scores)
    weights = [math.exp((s - top) / temperature) for s in scores]
    return random.Random(seed).choices(range(len(scores)), weights=weights)[0]


def template_messages(
    native_tools: bool, raw: object, tools: list[Json], ep: GatewayEpisode | None
) -> list[Json]:
    """A request's `messages` as the template's conversation: an assistant call the model wrote
    is replayed as exactly what it wrote (`ep.raw_text`); tools without native template support
    go in STACX's text format."""
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
            raw_text = ep.raw_text(tuple(c[0] for c in calls)) if ep else None
            if raw_text is not None:  # exactly what the model wrote
                out.append({"role": "assistant", "content": raw_text})
            elif native_tools:
                out.append(
                    {
                        "role": "assistant",
                        "content": content,
                        "tool_calls": [
                            {
                                "type": "function",
                                "id": cid,
                                "function": {"name": name, "arguments": args},
                            }
                            for cid, name, args in calls
                        ],
                    }
                )
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
    close = text[text.index(marker) + len(marker) :] if marker in text else ""
    ids = tok.encode(close.strip() or close, add_special_tokens=False) if close.strip() else []
    if ids:
        stops.add(ids[0])
    return sorted(stops)

"""How the SWE agent writes an action: the system prompt, an optional prefill, stop texts, and
the parser. Two formats, chosen by ``agent.format`` in a recipe (or ``stacx eval --format``):

``tool_call`` (default) — Hermes/Qwen tool calls, the full tool set (bash, view, create,
str_replace, submit); what instruction-tuned models of a few billion parameters follow::

    <tool_call>{"name": "bash", "arguments": {"command": "ls -la"}}</tool_call>

``bash`` — one ```bash block per reply, the command runs as the bash tool; ``submit`` alone in
the block finishes (as in mini-SWE-agent). The assistant message is *prefilled* with
"```bash\\n" (those tokens are part of the prompt the model saw, so the trace stays
token-exact) and generation stops at the closing fence. A 135M model almost never writes a
valid tool call, but it completes a prefilled shell block with a plausible command: this is
the format that gives the tiny recipes a reward signal to learn from.

Guarantees: `parse` never raises and takes the text the model generated *after* the prefill;
`render` is the inverse for scripted actors (the oracle), so their demonstrations are in the
format the student is trained to produce.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from stacx.agents import prompts
from stacx.agents.tools import SUBMIT
from stacx.errors import ConfigError
from stacx.toolcalls import MalformedCall, ToolCall, parse_action, render_tool_call

if TYPE_CHECKING:
    from stacx.agents.chat import ChatFormat

FormatName = Literal["tool_call", "bash"]
FORMATS: tuple[str, ...] = ("tool_call", "bash")

FENCE = "```"


class CallFormat:
    """The tool-call format (see the module docstring); the base of the others."""

    name: str = "tool_call"
    prefill: str = ""  # text the assistant message starts with, given to the model
    stop_texts: tuple[str, ...] = ()  # generation also stops at these (where one token each)
    no_call: str = prompts.NO_CALL  # the observation when a reply holds no action

    def system_prompt(self) -> str:
        return prompts.system_prompt()

    def render(self, name: str, arguments: dict[str, object]) -> str:
        return render_tool_call(name, arguments)

    def parse(self, text: str) -> ToolCall | MalformedCall | None:
        return parse_action(text)

    def stop_token_ids(self, chat: ChatFormat) -> list[int]:
        """The chat's end-of-turn ids plus each stop text that is one token (one that is not
        cannot stop generation; the parser still cuts there)."""
        extra = [ids[0] for ids in map(chat.content_ids, self.stop_texts) if len(ids) == 1]
        return sorted({*chat.stop_token_ids, *extra})


class BashBlockFormat(CallFormat):
    name = "bash"
    prefill = FENCE + "bash\n"
    stop_texts = (FENCE,)
    no_call = "Reply with one ```bash block holding a command, or `submit` when the task is done."

    def system_prompt(self) -> str:
        return prompts.bash_system_prompt()

    def render(self, name: str, arguments: dict[str, object]) -> str:
        if name == SUBMIT:
            return f"{SUBMIT}\n{FENCE}"
        if name != "bash":
            raise ValueError(f"the bash format has only the bash and submit actions, not {name!r}")
        return f"{str(arguments['command']).rstrip()}\n{FENCE}"

    def parse(self, text: str) -> ToolCall | MalformedCall | None:
        end = text.find(FENCE)
        command = (text if end < 0 else text[:end]).strip()
        if not command:
            return MalformedCall(error="The ```bash block is empty.", raw=text)
        if command == SUBMIT:
            return ToolCall(name=SUBMIT)
        return ToolCall(name="bash", arguments={"command": command})


def get_format(name: str) -> CallFormat:
    if name == "tool_call":
        return CallFormat()
    if name == "bash":
        return BashBlockFormat()
    raise ConfigError(f"agent.format = {name!r}: accepted values are {', '.join(FORMATS)}")

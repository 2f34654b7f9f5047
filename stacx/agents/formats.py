"""How the SWE agent writes an action (``agent.format``): ``tool_call`` (Hermes/Qwen tool calls, the
full tool set) or ``bash`` (one prefilled ```bash block per reply, what a 135M model can do): the
system prompt, prefill, stop texts and parser. `parse` never raises and reads the text after the
prefill; `render` is its inverse for scripted actors.

Design: docs/agents.md#action-formats-and-task-filters
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
    """The tool-call format; the base of the others."""

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
        """The end-of-turn ids plus each one-token stop text (the parser cuts at the others)."""
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

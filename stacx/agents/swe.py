"""The SWE agent's tool adapter for the agent loop: a reply read in the action format
(stacx.agents.formats), its call run as a SWE tool (stacx.agents.tools), the result the next
observation; ``submit`` ends the episode.

Design: docs/agents.md#the-agent-loop
"""

from __future__ import annotations

from typing import Self

import msgspec

from stacx.agents import prompts
from stacx.agents.chat import ChatFormat
from stacx.agents.formats import FormatName, get_format
from stacx.agents.policies import ScriptedGeneration
from stacx.agents.tools import Observation, ToolLimits, ToolLog, execute, render_observation
from stacx.ports import Generation, Sandbox, Task
from stacx.toolcalls import MalformedCall, ToolCall


class SweTools(msgspec.Struct, frozen=True, kw_only=True, tag="swe"):
    format: FormatName = "tool_call"  # how actions are written; see stacx.agents.formats
    limits: ToolLimits = msgspec.field(default_factory=ToolLimits)

    def prompt(self, chat: ChatFormat, instruction: str) -> list[int]:
        fmt = get_format(self.format)
        return chat.start(fmt.system_prompt(), prompts.task_message(instruction)) + self.prefill(
            chat
        )

    def prefill(self, chat: ChatFormat) -> list[int]:
        return chat.content_ids(get_format(self.format).prefill)

    def stop_token_ids(self, chat: ChatFormat) -> list[int]:
        return get_format(self.format).stop_token_ids(chat)

    def for_task(self, task: Task) -> Self:
        return self

    async def step(self, gen: Generation, text: str, sandbox: Sandbox, log: ToolLog) -> str | None:
        """Run the reply's call; the observation, or None once the episode is submitted."""
        fmt = get_format(self.format)
        scripted = gen.call if isinstance(gen, ScriptedGeneration) else None
        parsed = scripted.call if scripted else fmt.parse(text)
        if parsed is None:
            return fmt.no_call
        if isinstance(parsed, MalformedCall):
            tool = "invalid"
            await log.called(tool, {"raw": parsed.raw})
            obs = Observation(output="", error=parsed.error)
        else:
            tool = parsed.name
            await log.called(tool, parsed.arguments)
            obs = await execute(parsed, sandbox, self.limits, scripted.run if scripted else None)
        await log.returned(tool, obs)
        if obs.submitted:
            return None
        body = render_observation(obs)
        if isinstance(parsed, ToolCall) and parsed.extra_calls:
            body += prompts.extra_calls_note(parsed.extra_calls)
        return prompts.observation_message(tool, body)

    async def replay(
        self, tool: str, arguments: dict[str, object], sandbox: Sandbox
    ) -> Observation | None:
        """A recorded call run again through the same tools; None for a malformed one."""
        if tool == "invalid":
            return None
        return await execute(ToolCall(name=tool, arguments=arguments), sandbox, self.limits)

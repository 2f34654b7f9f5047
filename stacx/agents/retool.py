"""The ReTool agent (Feng et al. 2025): multi-turn reasoning that may run Python in the sandbox,
ending with a final answer in ``\\boxed{...}``, written where the task's verifier reads it. A
reply's boxed answer wins over its code; only sandbox transport errors raise.

Design: docs/agents.md#the-agent-loop
"""

from __future__ import annotations

import re
import time
from typing import Literal, Protocol, Self

import msgspec

from stacx.agents import retool_prompt as prompts
from stacx.agents.chat import ChatFormat
from stacx.agents.tools import Observation, ToolLog, truncate
from stacx.ports import Generation, Sandbox, Task
from stacx.toolcalls import OPEN_TAG, MalformedCall, ToolCall, parse_action

PYTHON = "python"
ANSWER = "answer"

_BOXED = re.compile(r"\\boxed\s*\{")
_CODE = re.compile(r"```(?:python|py|python3)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


class RetoolTools(msgspec.Struct, frozen=True, kw_only=True, tag="retool"):
    """The ReTool adapter of the agent loop: run a reply's Python or record its answer."""

    style: Literal["python", "tool_call"] = "python"  # how the system prompt shows a run
    python_timeout_s: float = 10.0
    max_output_bytes: int = 2048  # cap on the interpreter output the model sees
    answer_path: str | None = None  # where the final answer is written, for the verifier

    def prompt(self, chat: ChatFormat, instruction: str) -> list[int]:
        return chat.start(prompts.system_prompt(self.style), prompts.task_message(instruction))

    def prefill(self, chat: ChatFormat) -> list[int]:
        return []

    def stop_token_ids(self, chat: ChatFormat) -> list[int]:
        return chat.stop_token_ids

    def for_task(self, task: Task) -> Self:
        """Writing the answer where the task's metadata says (answer tasks; else nowhere)."""
        path = task.config.metadata.get("answer_path")
        return msgspec.structs.replace(self, answer_path=path if isinstance(path, str) else None)

    async def step(self, gen: Generation, text: str, sandbox: Sandbox, log: ToolLog) -> str | None:
        """Act on the reply; the observation, or None once an answer is given."""
        reply = parse_reply(text)
        if isinstance(reply, FinalAnswer):
            await log.called(ANSWER, {"answer": reply.answer})
            await log.returned(ANSWER, await self._answer(reply.answer, sandbox))
            return None
        if reply is None:
            return prompts.NO_ACTION
        if isinstance(reply, MalformedCall):
            await log.called("invalid", {"raw": reply.raw})
            await log.returned("invalid", Observation(output="", error=reply.error))
            return f"Error: {reply.error}"
        await log.called(PYTHON, {"code": reply.code})
        obs = await run_python(reply.code, sandbox, self)
        await log.returned(PYTHON, obs)
        return prompts.output_message(obs.output)

    async def replay(
        self, tool: str, arguments: dict[str, object], sandbox: Sandbox
    ) -> Observation | None:
        """A recorded call run again as `step` ran it; None for a malformed call."""
        if tool == PYTHON:
            return await run_python(str(arguments.get("code", "")), sandbox, self)
        if tool == ANSWER:
            return await self._answer(str(arguments.get("answer", "")), sandbox)
        return None

    async def _answer(self, answer: str, sandbox: Sandbox) -> Observation:
        """The final answer, written where the task's verifier reads it."""
        t0 = time.perf_counter()
        if self.answer_path:
            await sandbox.write_file(self.answer_path, answer)
        ms = (time.perf_counter() - t0) * 1000
        return Observation(output="Answer recorded.", duration_ms=ms)


class FinalAnswer(msgspec.Struct, frozen=True):
    answer: str


class PythonCode(msgspec.Struct, frozen=True):
    code: str


Reply = FinalAnswer | PythonCode | MalformedCall | None


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in `text` with balanced braces, else None."""
    found = None
    for m in _BOXED.finditer(text):
        depth = 1
        for i in range(m.end(), len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    found = text[m.end() : i].strip()
                    break
    return found


def parse_reply(text: str) -> Reply:
    """What a reply asks for (a boxed answer, then Python, else nothing); never raises."""
    boxed = last_boxed(text)
    if boxed:
        return FinalAnswer(boxed)
    return parse_code(text)


def parse_code(text: str) -> PythonCode | MalformedCall | None:
    """A reply's ``python`` tool call, else its first ```python block (closed or not); a
    malformed call or an empty block as MalformedCall; None if neither."""
    if OPEN_TAG in text:
        call = parse_action(text)
        if isinstance(call, MalformedCall):
            return call
        if isinstance(call, ToolCall):
            code = call.arguments.get("code")
            if call.name != PYTHON:
                return MalformedCall(
                    error=f"Unknown tool {call.name!r}; the tool is python.", raw=text
                )
            if not isinstance(code, str):
                return MalformedCall(
                    error='Tool "python" needs a string argument "code".', raw=text
                )
            return (
                PythonCode(code)
                if code.strip()
                else MalformedCall(error=prompts.EMPTY_CODE, raw=text)
            )
    m = _CODE.search(text)
    if m is None:
        return None
    code = m.group(1).strip("\n")
    return PythonCode(code) if code.strip() else MalformedCall(error=prompts.EMPTY_CODE, raw=text)


def render_output(
    stdout: str, stderr: str, exit_code: int | None, timed_out: bool, timeout: float
) -> str:
    """The interpreter's result as the model sees it (before the cap)."""
    parts = [stdout.rstrip("\n")] if stdout.strip() else []
    if stderr.strip():
        parts.append(stderr.rstrip("\n"))
    if timed_out:
        parts.append(f"[timed out after {timeout:g} s]")
    elif exit_code not in (0, None) and not stderr.strip():
        parts.append(f"[exit code {exit_code}]")
    return "\n".join(parts) if parts else "[no output]"


class Interpreter(Protocol):
    """What `run_python` reads of an adapter's settings (ReTool's, the MLE agent's)."""

    @property
    def python_timeout_s(self) -> float: ...

    @property
    def max_output_bytes(self) -> int: ...


async def run_python(code: str, sandbox: Sandbox, config: Interpreter) -> Observation:
    """Run `code` with python3 in `sandbox`; sandbox transport errors propagate."""
    t0 = time.perf_counter()
    timeout = config.python_timeout_s
    res = await sandbox.exec(["python3", "-c", code], timeout=timeout)
    text = render_output(res.stdout, res.stderr, res.exit_code, res.timed_out, timeout)
    output, cut = truncate(text, config.max_output_bytes)
    return Observation(
        output=output,
        exit_code=res.exit_code,
        timed_out=res.timed_out,
        truncated=res.truncated or cut,
        duration_ms=(time.perf_counter() - t0) * 1000,
    )

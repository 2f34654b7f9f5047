"""The ReTool agent with scripted policies in a real process sandbox (no Docker, no model):
Python runs and its output comes back, the boxed answer ends the episode and reaches the
verifier, and every turn's prompt extends the previous prompt + output token for token."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import msgspec
import pytest

from stacx.agents.chat import ChatFormat
from stacx.agents.loop import AgentConfig, loop_agents, run_agent
from stacx.agents.policies import ScriptedPolicy, always
from stacx.agents.retool import FinalAnswer, PythonCode, RetoolTools, last_boxed, parse_reply
from stacx.agents.retool_prompt import NO_ACTION, output_message
from stacx.events import (
    Event,
    StopReason,
    ToolCalled,
    ToolReturned,
    TurnGenerated,
    full_prompts,
)
from stacx.harbor.jsonl_tasks import ANSWER_PATH, AnswerRecord, answer_task
from stacx.ports import AgentResult, Limits
from stacx.sandbox.answers import verify_answer
from stacx.sandbox.process import ProcessSandbox
from stacx.sandbox.verifier import VerifierResult
from stacx.toolcalls import MalformedCall, render_tool_call

PY = "```python\n{}\n```"


@pytest.fixture
async def sandbox() -> AsyncIterator[ProcessSandbox]:
    async with ProcessSandbox(Limits(memory_mb=1024, allow_internet=False)) as sb:
        yield sb


class Log:
    def __init__(self) -> None:
        self.events: list[Event] = []

    async def __call__(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type[Event]) -> list:  # type: ignore[type-arg]
        return [e for e in self.events if isinstance(e, kind)]


async def play(
    chat: ChatFormat,
    sandbox: ProcessSandbox,
    script: list[str],
    tools: RetoolTools | None = None,
    max_turns: int = 4,
    answer_path: str | None = ANSWER_PATH,
) -> tuple[Log, AgentResult]:
    log = Log()
    tools = msgspec.structs.replace(tools or RetoolTools(), answer_path=answer_path)
    result = await run_agent(
        run_id="r",
        episode_id="e",
        instruction="What is 6 * 7?",
        sandbox=sandbox,
        chat=chat,
        executor=always(ScriptedPolicy(chat, script, actor="oracle")),
        config=AgentConfig(max_turns=max_turns, tools=tools),
        emit=log,
    )
    return log, result


async def test_python_runs_output_is_fed_back_and_boxed_answer_is_verified(
    chat: ChatFormat, sandbox: ProcessSandbox
) -> None:
    task = answer_task(AnswerRecord(id="t", problem="What is 6 * 7?", answer="42"), "/x.jsonl")
    agent = loop_agents(
        chat,
        AgentConfig(tools=RetoolTools()),
        lambda _t, _i: always(
            ScriptedPolicy(
                chat, ["I compute.\n" + PY.format("print(6 * 7)"), "So \\boxed{42}."], "oracle"
            )
        ),
    )(task, 0)
    log = Log()
    result = await agent.run(
        run_id="r", episode_id="e", instruction=task.instruction, sandbox=sandbox, emit=log
    )
    assert result.stop_reason == StopReason.SUBMITTED and result.n_turns == 2
    assert [c.tool for c in log.of(ToolCalled)] == ["python", "answer"]
    ran, _ = log.of(ToolReturned)
    assert ran.output == "42" and ran.exit_code == 0
    assert '"answer":"42"' in log.of(ToolCalled)[1].arguments_json
    first, second = log.of(TurnGenerated)
    # stored linearly: the second turn holds only the ids after the first's prompt + output
    assert second.prefix_len == len(first.prompt_ids) + len(first.output_ids)
    fed_back = chat.decode(second.prompt_ids)
    assert output_message("42") in fed_back
    assert (await sandbox.read_file(ANSWER_PATH)) == b"42"
    outcome = await verify_answer(sandbox, task)
    assert isinstance(outcome, VerifierResult) and outcome.reward == 1.0


async def test_every_prompt_extends_the_last_prompt_and_output_exactly(
    chat: ChatFormat, sandbox: ProcessSandbox
) -> None:
    script = [
        "Hmm, let me think.",  # no action: a reminder, no tool events
        '<tool_call>{"name": "python", "arguments": {"code": "print(1"</tool_call>',  # malformed
        PY.format("raise ValueError('boom')"),  # an error is an observation
        render_tool_call("python", {"code": "print(sum(range(10)))"}),  # the tool-call form
        "The sum is \\boxed{45}.",
    ]
    log, result = await play(chat, sandbox, script, max_turns=8)
    turns = log.of(TurnGenerated)
    assert [t.turn for t in turns] == list(range(5))
    whole = full_prompts([(t.turn, t.prefix_len, t.prompt_ids, t.output_ids) for t in turns])
    for i, (prev, nxt) in enumerate(itertools.pairwise(turns)):
        head = whole[i] + prev.output_ids
        assert nxt.prefix_len == len(head)  # stored linearly: the loop checked this prefix
        assert whole[i + 1][: len(head)] == head
        # what follows is exactly the close and the observation message's framing
        tail = nxt.prompt_ids
        frame = chat.close(prev.output_ids) + chat.obs_open_ids
        assert (
            tail[: len(frame)] == frame and tail[-len(chat.obs_close_ids) :] == chat.obs_close_ids
        )
    first_tail = turns[1].prompt_ids
    assert first_tail == chat.close(turns[0].output_ids) + chat.observation(NO_ACTION)
    assert result.transcript_ids == whole[-1] + turns[-1].output_ids
    assert [c.tool for c in log.of(ToolCalled)] == ["invalid", "python", "python", "answer"]
    invalid, error, summed, _ = log.of(ToolReturned)
    assert "not valid JSON" in invalid.error
    assert "ValueError: boom" in error.output and error.exit_code == 1
    assert summed.output == "45"


async def test_timeout_and_flood_are_observations_not_crashes(
    chat: ChatFormat, sandbox: ProcessSandbox
) -> None:
    script = [PY.format("while True: pass"), PY.format("print('x' * 100000)"), "\\boxed{1}"]
    log, result = await play(
        chat, sandbox, script, RetoolTools(python_timeout_s=1, max_output_bytes=500)
    )
    assert result.stop_reason == StopReason.SUBMITTED
    loop, flood, _ = log.of(ToolReturned)
    assert loop.timed_out and "[timed out after 1 s]" in loop.output
    assert flood.truncated and "bytes truncated" in flood.output and len(flood.output) < 700


async def test_no_answer_scores_zero_and_max_turns_stops(
    chat: ChatFormat, sandbox: ProcessSandbox
) -> None:
    task = answer_task(AnswerRecord(id="t", problem="?", answer="42"), "/x.jsonl")
    _, result = await play(chat, sandbox, [PY.format("print(1)")] * 5, max_turns=3)
    assert result.stop_reason == StopReason.MAX_TURNS and result.n_turns == 3
    outcome = await verify_answer(sandbox, task)
    assert isinstance(outcome, VerifierResult)
    assert outcome.reward == 0.0 and outcome.metrics["answered"] == 0.0


async def test_wrong_answer_scores_zero(chat: ChatFormat, sandbox: ProcessSandbox) -> None:
    task = answer_task(AnswerRecord(id="t", problem="?", answer="3/4"), "/x.jsonl")
    await play(chat, sandbox, ["\\boxed{0.7}"])
    outcome = await verify_answer(sandbox, task)
    assert isinstance(outcome, VerifierResult) and outcome.reward == 0.0
    await play(chat, sandbox, ["\\boxed{\\frac{3}{4}}"])
    outcome = await verify_answer(sandbox, task)
    assert isinstance(outcome, VerifierResult) and outcome.reward == 1.0


def test_parse_reply_reads_answer_then_code() -> None:
    assert parse_reply("so \\boxed{\\frac{1}{2}} done") == FinalAnswer("\\frac{1}{2}")
    assert last_boxed("\\boxed{1} then \\boxed{2}") == "2"
    assert last_boxed("\\boxed{unclosed") is None
    # a boxed answer after code ends the episode: the model has committed
    assert parse_reply(PY.format("print(2)") + "\n\\boxed{2}") == FinalAnswer("2")
    assert parse_reply("```py\nx = 1\nprint(x)") == PythonCode("x = 1\nprint(x)")  # cut off
    assert parse_reply("```bash\nls\n```") is None
    assert isinstance(parse_reply(PY.format("  ")), MalformedCall)
    other = parse_reply(render_tool_call("bash", {"command": "ls"}))
    assert isinstance(other, MalformedCall) and "python" in other.error
    missing = parse_reply(render_tool_call("python", {"src": "1"}))
    assert isinstance(missing, MalformedCall) and '"code"' in missing.error

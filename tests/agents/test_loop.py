"""The agent loop against a real Docker sandbox, with scripted policies (fast, deterministic)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import pytest

from stacx.agents.chat import ChatFormat
from stacx.agents.formats import get_format
from stacx.agents.loop import AgentConfig, run_agent, turn_seed
from stacx.agents.policies import ScriptedPolicy, always, null_policy, oracle_policy
from stacx.agents.swe import SweTools
from stacx.agents.tools import ToolLimits
from stacx.events import Event, StopReason, ToolCalled, ToolReturned, TurnGenerated, full_prompts
from stacx.sandbox.docker import DockerSandbox, Limits
from stacx.sandbox.images import BASE_IMAGE
from stacx.toolcalls import render_tool_call

pytestmark = pytest.mark.docker


@pytest.fixture
async def sandbox() -> AsyncIterator[DockerSandbox]:
    sb = await DockerSandbox.create(BASE_IMAGE, Limits(allow_internet=False, memory_mb=256))
    try:
        yield sb
    finally:
        await sb.close()


class Log:
    def __init__(self) -> None:
        self.events: list[Event] = []

    async def __call__(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type[Event]) -> list:  # type: ignore[type-arg]
        return [e for e in self.events if isinstance(e, kind)]


def assert_token_exact(turns: list[TurnGenerated]) -> None:
    """Every prompt extends the previous prompt + output, so it is stored linearly: turn 0
    whole, each later turn as prefix_len (that prefix, checked by the loop) + its new ids."""
    whole = full_prompts([(t.turn, t.prefix_len, t.prompt_ids, t.output_ids) for t in turns])
    assert turns[0].prefix_len == 0
    for i, (prev, nxt) in enumerate(itertools.pairwise(turns)):
        assert nxt.prefix_len == len(whole[i]) + len(prev.output_ids) > 0
        assert whole[i + 1] == whole[i] + prev.output_ids + nxt.prompt_ids


async def test_scripted_episode_uses_every_tool(sandbox: DockerSandbox, chat: ChatFormat) -> None:
    script = [
        "I will look around first.",  # no call: a format reminder, no tool events
        '<tool_call>{"name": "bash", "arguments": {"command": "ls"</tool_call>',  # malformed
        render_tool_call("create", {"path": "/work/a/b.py", "content": "x = 1\ny = 2\n"}),
        render_tool_call(
            "str_replace", {"path": "/work/a/b.py", "old_str": "y = 2", "new_str": "y = 3"}
        ),
        render_tool_call("view", {"path": "/work/a/b.py"}),
        render_tool_call("str_replace", {"path": "/work/a/b.py", "old_str": "nope", "new_str": ""}),
        "```bash\nseq 1 100000; echo oops >&2; exit 3\n```",
        render_tool_call("rm", {"path": "/"}),
        render_tool_call("submit", {}),
    ]
    log = Log()
    result = await run_agent(
        run_id="r",
        episode_id="e",
        instruction="Do things.",
        sandbox=sandbox,
        chat=chat,
        executor=always(ScriptedPolicy(chat, script, actor="oracle")),
        config=AgentConfig(max_turns=20, tools=SweTools(limits=ToolLimits(max_bytes=2000))),
        emit=log,
    )
    assert result.stop_reason == StopReason.SUBMITTED
    assert result.n_turns == len(script)
    turns = log.of(TurnGenerated)
    assert [t.turn for t in turns] == list(range(len(script)))
    assert all(
        t.actor == "oracle" and t.logprobs is None and t.weight_version is None for t in turns
    )
    assert_token_exact(turns)
    called, returned = log.of(ToolCalled), log.of(ToolReturned)
    assert [c.tool for c in called] == [
        "invalid",
        "create",
        "str_replace",
        "view",
        "str_replace",
        "bash",
        "rm",
        "submit",
    ]
    assert [r.call_id for r in returned] == [c.call_id for c in called]
    by_tool = {r.turn: r for r in returned}
    assert "not valid JSON" in by_tool[1].error
    assert "1\tx = 1" in by_tool[4].output and "y = 3" in by_tool[4].output
    assert "does not occur" in by_tool[5].error
    flood = by_tool[6]
    assert flood.truncated and "bytes truncated ...]" in flood.output
    assert flood.exit_code == 3 and flood.output.rstrip().endswith("[exit code 3]")
    assert "Unknown tool 'rm'" in by_tool[7].error
    assert (await sandbox.read_file("/work/a/b.py")) == b"x = 1\ny = 3\n"
    # what the model saw after the malformed call is the error, inside the transcript (turn 2
    # stores only the ids after turn 1's prompt + output: that observation)
    assert_token_exact(turns)
    assert "not valid JSON" in chat.decode(turns[2].prompt_ids)


async def test_bash_timeout_is_an_observation_not_a_crash(
    sandbox: DockerSandbox, chat: ChatFormat
) -> None:
    log = Log()
    script = [
        render_tool_call("bash", {"command": "sleep 30", "timeout": 1}),
        render_tool_call("submit", {}),
    ]
    result = await run_agent(
        run_id="r",
        episode_id="e",
        instruction="t",
        sandbox=sandbox,
        chat=chat,
        executor=always(ScriptedPolicy(chat, script, actor="oracle")),
        config=AgentConfig(),
        emit=log,
    )
    assert result.stop_reason == StopReason.SUBMITTED
    (first, _) = log.of(ToolReturned)
    assert first.timed_out and "[timed out after 1 s]" in first.output


async def test_max_turns_stops_the_episode(sandbox: DockerSandbox, chat: ChatFormat) -> None:
    log = Log()
    script = [render_tool_call("bash", {"command": "true"})] * 5
    result = await run_agent(
        run_id="r",
        episode_id="e",
        instruction="t",
        sandbox=sandbox,
        chat=chat,
        executor=always(ScriptedPolicy(chat, script, actor="oracle")),
        config=AgentConfig(max_turns=3),
        emit=log,
    )
    assert result.stop_reason == StopReason.MAX_TURNS
    assert len(log.of(TurnGenerated)) == 3


async def test_context_budget_stops_before_overflow(
    sandbox: DockerSandbox, chat: ChatFormat
) -> None:
    log = Log()
    script = [render_tool_call("bash", {"command": "seq 1 3000"})] * 10
    start = len(chat.start("x", "t"))
    budget = start + 1500
    result = await run_agent(
        run_id="r",
        episode_id="e",
        instruction="t",
        sandbox=sandbox,
        chat=chat,
        executor=always(ScriptedPolicy(chat, script, actor="oracle")),
        config=AgentConfig(max_turns=10, context_budget=budget, max_new_tokens=4000),
        emit=log,
    )
    assert result.stop_reason == StopReason.CONTEXT_EXHAUSTED
    turns = log.of(TurnGenerated)
    assert 1 <= len(turns) < 10
    assert all(t.prefix_len + len(t.prompt_ids) + len(t.output_ids) <= budget for t in turns)
    assert (
        len(result.transcript_ids) > budget - 32
    )  # it stopped because the next prompt was too long


async def test_executor_picks_the_actor_of_each_turn(
    sandbox: DockerSandbox, chat: ChatFormat
) -> None:
    teacher = ScriptedPolicy(
        chat, [render_tool_call("bash", {"command": "echo t"})] * 3, actor="teacher"
    )
    student = ScriptedPolicy(
        chat, [render_tool_call("bash", {"command": "echo s"})] * 3, actor="student"
    )
    log = Log()
    await run_agent(
        run_id="r",
        episode_id="e",
        instruction="t",
        sandbox=sandbox,
        chat=chat,
        executor=lambda turn: teacher if turn % 2 == 0 else student,
        config=AgentConfig(max_turns=4),
        emit=log,
    )
    assert [t.actor for t in log.of(TurnGenerated)] == ["teacher", "student", "teacher", "student"]
    assert [r.output.split("\n")[0] for r in log.of(ToolReturned)] == ["t", "s", "t", "s"]


async def test_oracle_runs_solve_sh_then_submits(sandbox: DockerSandbox, chat: ChatFormat) -> None:
    log = Log()
    solve = "#!/bin/bash\nset -e\nmkdir -p /app\ncat > /app/answer.txt <<'EOF'\n42\nEOF\n"
    result = await run_agent(
        run_id="r",
        episode_id="e",
        instruction="t",
        sandbox=sandbox,
        chat=chat,
        executor=always(oracle_policy(chat, solve)),
        config=AgentConfig(),
        emit=log,
    )
    assert result.stop_reason == StopReason.SUBMITTED
    assert [t.actor for t in log.of(TurnGenerated)] == ["oracle", "oracle"]
    assert (await sandbox.read_file("/app/answer.txt")) == b"42\n"


async def test_null_agent_only_submits(sandbox: DockerSandbox, chat: ChatFormat) -> None:
    log = Log()
    result = await run_agent(
        run_id="r",
        episode_id="e",
        instruction="t",
        sandbox=sandbox,
        chat=chat,
        executor=always(null_policy(chat)),
        config=AgentConfig(),
        emit=log,
    )
    assert result.stop_reason == StopReason.SUBMITTED and result.n_turns == 1
    assert [(t.actor, t.logprobs) for t in log.of(TurnGenerated)] == [("null", None)]
    assert [c.tool for c in log.of(ToolCalled)] == ["submit"]


async def test_script_that_runs_out_is_agent_done(sandbox: DockerSandbox, chat: ChatFormat) -> None:
    log = Log()
    script = [render_tool_call("bash", {"command": "true"})]
    result = await run_agent(
        run_id="r",
        episode_id="e",
        instruction="t",
        sandbox=sandbox,
        chat=chat,
        executor=always(ScriptedPolicy(chat, script, actor="oracle")),
        config=AgentConfig(),
        emit=log,
    )
    assert result.stop_reason == StopReason.AGENT_DONE and result.n_turns == 1


def test_turn_seeds_are_stable_and_distinct_across_samples() -> None:
    assert turn_seed(0, "episode-a", 1) == turn_seed(0, "episode-a", 1)
    seeds = {turn_seed(0, e, t) for e in ("episode-a", "episode-b") for t in range(3)}
    assert len(seeds) == 6


async def test_bash_format_episode_is_prefilled_and_token_exact(
    sandbox: DockerSandbox, chat: ChatFormat
) -> None:
    fmt = get_format("bash")
    log = Log()
    result = await run_agent(
        run_id="r",
        episode_id="e",
        instruction="Create /work/out.",
        sandbox=sandbox,
        chat=chat,
        executor=always(oracle_policy(chat, "mkdir -p /work/out && echo made", fmt)),
        config=AgentConfig(tools=SweTools(format="bash")),
        emit=log,
    )
    assert result.stop_reason == StopReason.SUBMITTED
    turns = log.of(TurnGenerated)
    prefill = chat.content_ids(fmt.prefill)
    (fence,) = chat.content_ids("```")
    for t in turns:
        assert t.prompt_ids[-len(prefill) :] == prefill  # the model continues the open block
        assert t.output_ids[-1] == fence  # and stops at its close, as a model would
    assert_token_exact(turns)
    assert [c.tool for c in log.of(ToolCalled)] == ["bash", "submit"]
    assert "made" in log.of(ToolReturned)[0].output
    assert (await sandbox.exec("test -d /work/out")).exit_code == 0
    # the system prompt is the bash format's, not the tool-call one
    assert "```bash block" in chat.decode(turns[0].prompt_ids)
    assert "<tool_call>" not in chat.decode(turns[0].prompt_ids)

"""The MLE agent (stacx.agents.mle) with scripted policies on a bundled MLE task, in a real
process sandbox with the real verifier (no model): its Python runs on the task's data, the
output comes back, SUBMIT ends the episode, and the submission it wrote is graded."""

from __future__ import annotations

from pathlib import Path

import pytest

from stacx.agents.chat import ChatFormat
from stacx.agents.loop import AgentConfig, run_agent
from stacx.agents.mle import NO_ACTION, MleTools, output_message
from stacx.agents.policies import ScriptedPolicy, always
from stacx.errors import ConfigError
from stacx.events import Event, RollIn, StopReason, ToolCalled, ToolReturned
from stacx.launch.loader import convert
from stacx.launch.roles import agent_config, rollout_config
from stacx.ports import AgentResult, Verdict
from stacx.sandbox.process_environments import ProcessEnvironments
from stacx.toolcalls import render_tool_call

IRIS = Path(__file__).resolve().parents[2] / "recipes" / "tasks" / "mle" / "train-iris"
PY = "```python\n{}\n```"


async def play(
    chat: ChatFormat, script: list[str], tools: MleTools | None = None
) -> tuple[list[Event], AgentResult, Verdict]:
    """The scripted replies as the MLE agent on the iris task, then its verifier."""
    events: list[Event] = []

    async def emit(event: Event) -> None:
        events.append(event)

    async with ProcessEnvironments(run_id="t") as envs:
        task = envs.task(str(IRIS))
        async with envs.sandbox(task, episode_id="e") as sb:
            result = await run_agent(
                run_id="r",
                episode_id="e",
                instruction=task.instruction,
                sandbox=sb,
                chat=chat,
                executor=always(ScriptedPolicy(chat, script, actor="student")),
                config=AgentConfig(max_turns=5, tools=tools or MleTools()),
                emit=emit,
            )
            return events, result, await envs.verify(sb, task, episode_id="e")


async def test_the_mle_agent_runs_python_on_the_data_and_submits(chat: ChatFormat) -> None:
    fit = (
        "import pandas as pd\n"
        "from sklearn.linear_model import LogisticRegression\n"
        "tr = pd.read_csv('data/train.csv'); te = pd.read_csv('data/test.csv')\n"
        "X = tr.drop(columns=['id', 'species'])\n"
        "m = LogisticRegression(max_iter=1000).fit(X, tr['species'])\n"
        "pd.DataFrame({'id': te['id'], 'species': m.predict(te[X.columns])})"
        ".to_csv('submission.csv', index=False)\n"
        "print('rows', len(te))"
    )
    script = [
        "Let me look.\n" + PY.format("print(open('data/train.csv').readline().strip())"),
        "Thinking only.",
        PY.format(fit) + "\nSUBMIT",
    ]
    events, result, verdict = await play(chat, script)
    assert result.stop_reason == StopReason.SUBMITTED and result.n_turns == 3
    assert [e.tool for e in events if isinstance(e, ToolCalled)] == ["python", "python"]
    header, fitted = (e for e in events if isinstance(e, ToolReturned))
    assert header.output.startswith("id,sepal length (cm)") and fitted.output == "rows 45"
    assert NO_ACTION in chat.decode(result.transcript_ids)  # the reply with neither
    assert verdict.reward > 0.9 and verdict.metrics["submitted"] == 1.0


async def test_submit_alone_ends_the_episode_and_says_the_file_is_missing(
    chat: ChatFormat,
) -> None:
    call = render_tool_call("python", {"code": "print(1 + 1)"})
    events, result, verdict = await play(chat, [call, "SUBMIT"], MleTools(style="tool_call"))
    assert result.stop_reason == StopReason.SUBMITTED and result.n_turns == 2
    ran, submitted = (e for e in events if isinstance(e, ToolReturned))
    assert ran.tool == "python" and ran.output == "2"
    assert output_message("2") in chat.decode(result.transcript_ids)
    assert submitted.tool == "submit" and "missing" in submitted.output
    assert verdict.reward == 0.0 and verdict.metrics == {"submitted": 0.0}


def test_a_recipe_with_agent_mle_gets_the_mle_adapter() -> None:
    r = convert({"name": "x", "agent": {"name": "mle", "format": "python", "max_turns": 3}})
    config = agent_config(r)
    assert isinstance(config.tools, MleTools) and config.tools.style == "python"
    assert rollout_config(r).policy == RollIn.STUDENT
    with pytest.raises(ConfigError, match=r"agent\.format = 'bash': the mle agent runs python"):
        convert({"name": "x", "agent": {"name": "mle", "format": "bash"}})

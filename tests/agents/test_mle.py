"""The MLE agent (stacx.agents.mle) with scripted policies on a bundled MLE task, in a real
process sandbox with the real verifier (no model): its Python runs on the task's data, the
output comes back, SUBMIT ends the episode, and the submission it wrote is graded."""

from __future__ import annotations

from pathlib import Path

from stacx.agents.chat import ChatFormat
from stacx.agents.loop import AgentConfig, run_agent
from stacx.agents.mle import NO_ACTION, MleTools, output_message
from stacx.agents.policies import ScriptedPolicy, always
from stacx.events import Event, StopReason, ToolCalled, ToolReturned
from stacx.sandbox.process_environments import ProcessEnvironments

IRIS = Path(__file__).resolve().parents[2] / "recipes" / "tasks" / "mle" / "train-iris"
PY = "```python\n{}\n```"


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
    events: list[Event] = []

    async def emit(event: Event) -> None:
        events.append(event)

    async with ProcessEnvironments(run_id="t") as envs:
        task = envs.task(str(IRIS))
        async with envs.sandbox(task, episode_id="e") as sb:
            result = await run_agent(
                run_id="r", episode_id="e", instruction=task.instruction, sandbox=sb, chat=chat,
                executor=always(ScriptedPolicy(chat, script, actor="student")),
                config=AgentConfig(max_turns=5, tools=MleTools()), emit=emit,
            )  # fmt: skip
            verdict = await envs.verify(sb, task, episode_id="e")
    assert result.stop_reason == StopReason.SUBMITTED and result.n_turns == 3
    assert [e.tool for e in events if isinstance(e, ToolCalled)] == ["python", "python"]
    header, fitted = (e for e in events if isinstance(e, ToolReturned))
    assert header.output.startswith("id,sepal length (cm)") and fitted.output == "rows 45"
    assert verdict.reward > 0.9


async def test_submit_alone_ends_the_episode_and_says_whether_the_file_exists(
    chat: ChatFormat,
) -> None:
    events: list[Event] = []

    async def emit(event: Event) -> None:
        events.append(event)

    async with ProcessEnvironments(run_id="t") as envs:
        task = envs.task(str(IRIS))
        async with envs.sandbox(task, episode_id="e") as sb:
            result = await run_agent(
                run_id="r", episode_id="e", instruction=task.instruction, sandbox=sb, chat=chat,
                executor=always(ScriptedPolicy(chat, ["Nothing to run.", "SUBMIT"], "student")),
                config=AgentConfig(max_turns=5, tools=MleTools()), emit=emit,
            )  # fmt: skip
    assert result.stop_reason == StopReason.SUBMITTED and result.n_turns == 2
    (returned,) = (e for e in events if isinstance(e, ToolReturned))
    assert returned.tool == "submit" and "missing" in returned.output
    assert NO_ACTION in chat.decode(result.transcript_ids)
    assert "SUBMIT" in output_message("x")

"""The MLE agent (MLE-Dojo style, recipes/tasks/mle): it explores a tabular competition's data, fits
models and writes /app/submission.csv by running Python in the sandbox, then says ``SUBMIT``. The
verifier grades the submission file whether or not the agent submitted.

Design: docs/agents.md#the-mle-agent
"""

from __future__ import annotations

import re
import shlex
import time
from typing import Literal, Self

import msgspec

from stacx.agents.chat import ChatFormat
from stacx.agents.retool import PYTHON, PythonCode, parse_code, run_python
from stacx.agents.tools import Observation, ToolLog
from stacx.ports import Generation, Sandbox, Task
from stacx.toolcalls import MalformedCall, render_tool_call

SUBMIT = "submit"
FENCE = "```"
_SUBMIT = re.compile(r"^\s*SUBMIT\s*$", re.MULTILINE)
_FENCED = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)

_EXAMPLE = """import pandas as pd
from sklearn.ensemble import RandomForestClassifier
train = pd.read_csv("/app/data/train.csv")
test = pd.read_csv("/app/data/test.csv")
X = pd.get_dummies(train.drop(columns=["id", "label"]))
Xt = pd.get_dummies(test.drop(columns=["id"])).reindex(columns=X.columns, fill_value=0)
model = RandomForestClassifier(random_state=0).fit(X.fillna(0), train["label"])
pd.DataFrame({"id": test["id"], "label": model.predict(Xt.fillna(0))}).to_csv(
    "/app/submission.csv", index=False)
print("written")"""


def system_prompt(style: str = "python") -> str:
    """The system prompt for `style`: "python" (fenced blocks) or "tool_call" (a python call)."""
    look = 'import pandas as pd\nprint(pd.read_csv("/app/data/train.csv").head())'
    if style == "tool_call":
        how = "To run Python, write exactly one call such as:\n" + render_tool_call(
            "python", {"code": look}
        )
        example = render_tool_call("python", {"code": _EXAMPLE})
    else:
        how = f"To run Python, write one block such as:\n{FENCE}python\n{look}\n{FENCE}"
        example = f"{FENCE}python\n{_EXAMPLE}\n{FENCE}"
    return (
        "You are a machine-learning engineer solving a prediction task. The data is in "
        "/app/data (train.csv with the target, test.csv without). Python 3 with pandas, numpy "
        f"and scikit-learn is installed. {how}\n"
        "Each block runs in a new process in /app; files persist, variables do not. Its "
        "printed output comes back in the next message. Look at the data, train a model, and "
        "write /app/submission.csv in the format the task gives. Then reply SUBMIT on a line "
        "of its own.\n\n"
        f"Example (target `label`):\n{example}\n"
        f"user: {output_message('written')}\n"
        "assistant: SUBMIT"
    )


def output_message(body: str) -> str:
    """The interpreter's output as the model sees it, with the reminder of how to finish."""
    return f"{FENCE}output\n{body}\n{FENCE}\n{AFTER_OUTPUT}"


AFTER_OUTPUT = "Once /app/submission.csv is written, reply SUBMIT."
NO_ACTION = (
    f"Your message held neither Python code nor SUBMIT. Run Python in a {FENCE}python block, "
    "or reply SUBMIT once /app/submission.csv is written."
)


class MleTools(msgspec.Struct, frozen=True, kw_only=True, tag="mle"):
    """The MLE adapter of the agent loop: run a reply's Python, end on SUBMIT."""

    style: Literal["python", "tool_call"] = "python"  # how the system prompt shows a run
    python_timeout_s: float = 120.0  # a model fit on a few thousand rows, with room
    max_output_bytes: int = 2048  # cap on the interpreter output the model sees
    submission_path: str = "/app/submission.csv"

    def prompt(self, chat: ChatFormat, instruction: str) -> list[int]:
        return chat.start(system_prompt(self.style), instruction.strip())

    def prefill(self, chat: ChatFormat) -> list[int]:
        return []

    def stop_token_ids(self, chat: ChatFormat) -> list[int]:
        return chat.stop_token_ids

    def for_task(self, task: Task) -> Self:
        """Every MLE task has the same submission path (its instruction says so)."""
        return self

    async def step(self, gen: Generation, text: str, sandbox: Sandbox, log: ToolLog) -> str | None:
        """Act on the reply; the observation, or None once the agent submits."""
        code = parse_code(text)
        submits = bool(_SUBMIT.search(_FENCED.sub("", text)))
        if isinstance(code, MalformedCall):
            await log.called("invalid", {"raw": code.raw})
            await log.returned("invalid", Observation(output="", error=code.error))
            return None if submits else f"Error: {code.error}"
        if isinstance(code, PythonCode):
            await log.called(PYTHON, {"code": code.code})
            obs = await run_python(code.code, sandbox, self)
            await log.returned(PYTHON, obs)
            return None if submits else output_message(obs.output)
        if submits:  # one tool pair per turn: SUBMIT after code ends with the code's pair
            await log.called(SUBMIT, {})
            await log.returned(SUBMIT, await self._submitted(sandbox))
            return None
        return NO_ACTION

    async def replay(
        self, tool: str, arguments: dict[str, object], sandbox: Sandbox
    ) -> Observation | None:
        """A recorded call run again as `step` ran it; None for a malformed call."""
        if tool == PYTHON:
            return await run_python(str(arguments.get("code", "")), sandbox, self)
        if tool == SUBMIT:
            return await self._submitted(sandbox)
        return None

    async def _submitted(self, sandbox: Sandbox) -> Observation:
        """Whether the submission file exists (the verifier grades it, or scores 0 without)."""
        t0 = time.perf_counter()
        res = await sandbox.exec(f"test -f {shlex.quote(self.submission_path)}", timeout=30)
        found = res.exit_code == 0
        output = f"{self.submission_path} {'found' if found else 'missing'}; submitted."
        return Observation(
            output=output, exit_code=res.exit_code, duration_ms=(time.perf_counter() - t0) * 1000
        )

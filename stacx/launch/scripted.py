"""The scripted agents' executors, the one oracle every path runs (``tasks check``, ``eval --agent
oracle``, SFT's demonstrations). ``oracle``: one turn whose text is the solution's body as a bash
call, executed as Harbor's oracle does (solution/ uploaded to /solution, ``bash /solution/solve.sh``
in the WORKDIR with [solution].env, as the agent user, under the agent timeout), then a submit turn.
``null``: one submit turn (the floor every task must beat). Limits: a task without solution/solve.sh
has no oracle (the launcher leaves it out and says so).
"""

from __future__ import annotations

from stacx.agents.chat import ChatFormat
from stacx.agents.formats import CallFormat
from stacx.agents.policies import MakeExecutor, ScriptedCall, always, null_policy, oracle_policy
from stacx.agents.tools import Observation, ToolRun, bash_observation
from stacx.harbor.tasks import resolve_env
from stacx.ports import Sandbox, Task
from stacx.rollout.episode import DEFAULT_AGENT_TIMEOUT_S
from stacx.toolcalls import ToolCall

SOLUTION_DIR = "/solution"
SOLVE_COMMAND = f"bash {SOLUTION_DIR}/solve.sh"


def run_solution(task: Task) -> ToolRun:
    """The task's solve.sh, run in a sandbox as Harbor's oracle runs it."""

    async def run(sandbox: Sandbox) -> Observation:
        env = resolve_env(task.config.solution.env, where=f"{task.path}/task.toml: solution.env")
        agent = task.config.agent
        timeout = agent.timeout_sec or DEFAULT_AGENT_TIMEOUT_S
        await sandbox.upload_dir(str(task.solution_dir), SOLUTION_DIR)
        result = await sandbox.exec(
            ["bash", f"{SOLUTION_DIR}/solve.sh"],
            timeout=timeout,
            env=env or None,
            user=None if agent.user is None else str(agent.user),
        )
        return bash_observation(result, timeout)

    return run


def solution_call(task: Task) -> ScriptedCall:
    return ScriptedCall(
        call=ToolCall(name="bash", arguments={"command": SOLVE_COMMAND}), run=run_solution(task)
    )


def scripted_executors(agent: str, chat: ChatFormat, fmt: CallFormat) -> MakeExecutor:
    """(task, sample_index) -> a fresh executor of the scripted `agent` (oracle or null)."""
    if agent == "oracle":
        return lambda task, _i: always(
            oracle_policy(
                chat, (task.solution_dir / "solve.sh").read_text(), fmt, solution_call(task)
            )
        )
    if agent == "null":
        return lambda _task, _i: always(null_policy(chat, fmt))
    raise ValueError(f"{agent!r} is not a scripted agent (oracle, null)")

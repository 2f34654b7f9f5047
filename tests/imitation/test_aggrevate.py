"""AggreVaTe branching on real Docker sandboxes, a real run (NATS + DuckDB), bundled task."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from stacx.actors.run import RunContext
from stacx.agents.chat import ChatFormat
from stacx.agents.loop import AgentConfig, LoopAgent
from stacx.agents.policies import ScriptedPolicy, always, oracle_policy
from stacx.events import TaskScheduled
from stacx.harbor.tasks import load_task
from stacx.imitation.aggrevate import (
    RECORDED_SQL,
    BranchActor,
    BranchSetup,
    RecordedTurn,
    run_branch,
)
from stacx.imitation.config import ImitationConfig
from stacx.ports import Task
from stacx.rollout.episode import EpisodeSpec, run_episode
from stacx.sandbox.environments import DockerEnvironments
from stacx.toolcalls import render_tool_call
from stacx.train import units
from stacx.train.config import TrainerConfig
from tests.imitation.conftest import BASIC, wait_for

pytestmark = pytest.mark.docker
AGENT = AgentConfig(max_turns=4)


def bash(command: str) -> str:
    return render_tool_call("bash", {"command": command})


SUBMIT = render_tool_call("submit", {})


def student(chat: ChatFormat, texts: list[str]) -> ScriptedPolicy:
    return ScriptedPolicy(chat, texts, actor="student")


def oracle(chat: ChatFormat, task: Task) -> ScriptedPolicy:
    return oracle_policy(chat, (Path(task.path) / "solution" / "solve.sh").read_text())


async def _parent(
    run: RunContext, envs: DockerEnvironments, chat: ChatFormat, task: Task, texts: list[str]
) -> str:
    """Record a learner episode that plays `texts` (scored by the real verifier)."""
    await run.emit(
        TaskScheduled(
            run_id=run.run_id, task_id=task.task_id, task_path=task.path, group_id="parents"
        )
    )
    spec = EpisodeSpec(
        run_id=run.run_id,
        task=task,
        group_id="parents",
        sample_index=0,
        attempt=0,
        policy="student",
    )
    await run_episode(
        spec,
        envs=envs,
        agent=LoopAgent(chat=chat, executor=always(student(chat, texts)), config=AGENT),
        emit=run.emit,
    )
    return spec.episode_id


async def test_non_deterministic_prefix_drops_the_branch(tmp_path: Path, chat: ChatFormat) -> None:
    task = load_task(BASIC / "write-answer-42")
    async with (
        RunContext(tmp_path / "run", recipe="test") as run,
        DockerEnvironments(run_id=run.run_id, emit=run.emit) as envs,
    ):
        parent = await _parent(
            run, envs, chat, task, [bash("echo $RANDOM$RANDOM"), bash("echo hi"), SUBMIT]
        )
        recorded = [
            msgspec.convert(r, RecordedTurn)
            for r in (await run.query(RECORDED_SQL, {"episode_id": parent})).to_pylist()
        ]
        setup = BranchSetup(
            run_id=run.run_id, task=task, parent_episode_id=parent, turn=1, agent=AGENT
        )
        cost = await run_branch(
            setup,
            0,
            recorded,
            envs=envs,
            chat=chat,
            learner=student(chat, [bash("echo explore")]),
            teacher=oracle(chat, task),
            emit=run.emit,
        )
        failures = (
            await run.query(
                "SELECT f.failure_kind, f.message FROM infra_failed f "
                "JOIN branch_created b ON b.episode_id = f.episode_id"
            )
        ).to_pylist()
        costs = await run.query("SELECT count(*) FROM cost_to_go_estimated")
        dataset = await run.query("SELECT count(*) FROM aggrevate_dataset")
    assert cost is None
    assert len(failures) == 1 and failures[0]["failure_kind"] == "non_determinism"
    assert "turn 0" in failures[0]["message"]
    assert costs.column(0)[0].as_py() == 0 and dataset.column(0)[0].as_py() == 0


async def test_branch_actor_estimates_cost_to_go_per_exploration_action(
    tmp_path: Path, chat: ChatFormat
) -> None:
    task = load_task(BASIC / "write-answer-42")
    # One turn in the parent, so the branched turn is 0: action 0 submits at once (fails the
    # verifier: cost 1), action 1 looks around and the teacher (oracle) finishes (cost 0).
    explore = {0: [SUBMIT], 1: [bash("ls /app")]}
    config = ImitationConfig(name="aggrevate", branches=2)
    async with (
        RunContext(tmp_path / "run", recipe="test") as run,
        DockerEnvironments(run_id=run.run_id, emit=run.emit) as envs,
    ):
        run.spawn(
            BranchActor(
                config=config,
                agent=AGENT,
                envs=envs,
                chat=chat,
                make_learner=lambda i: student(chat, explore[i]),
                make_teacher=lambda: oracle(chat, task),
            )
        )
        parent = await _parent(run, envs, chat, task, [SUBMIT])
        assert (
            await wait_for(run.query, "SELECT count(*) FROM cost_to_go_estimated", 2, timeout=240)
            == 2
        )
        await run.stop_actors()
        readiness = TrainerConfig(algorithm="aggrevate", branches=2)
        sql = units.waiting_sql(readiness)
        pending = (await run.query(sql, units.params(readiness, sql, 0))).column(0)[0].as_py()
        rows = (
            await run.query(
                "SELECT action_index, q, advantage, actor, prompt_ids, n_actions, parent_episode_id "
                "FROM aggrevate_dataset ORDER BY action_index"
            )
        ).to_pylist()
        parent_prompt = (
            (
                await run.query(
                    f"SELECT prompt_ids FROM turn_generated WHERE episode_id = '{parent}' AND turn = 0"
                )
            )
            .column(0)[0]
            .as_py()
        )
        branch_actors = (
            await run.query(
                "SELECT b.action_index, list(t.actor ORDER BY t.turn) AS actors FROM branch_created b "
                "JOIN turn_generated t ON t.episode_id = b.episode_id GROUP BY 1 ORDER BY 1"
            )
        ).to_pylist()
    assert [(r["action_index"], r["q"], r["advantage"]) for r in rows] == [
        (0, 1.0, -0.5),
        (1, 0.0, 0.5),
    ]
    assert all(r["parent_episode_id"] == parent and r["n_actions"] == 2 for r in rows)
    assert all(r["prompt_ids"] == parent_prompt for r in rows)  # the same state
    assert pending == 0  # what the trainer's readiness and the scheduler wait on
    # the learner explored at the state, the teacher finished (oracle: solve, submit)
    assert branch_actors == [
        {"action_index": 0, "actors": ["student"]},
        {"action_index": 1, "actors": ["student", "oracle", "oracle"]},
    ]

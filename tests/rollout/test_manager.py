"""The rollout manager end to end: real RunContext (NATS + DuckDB), real Docker, bundled tasks."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import msgspec
import pytest

from stacx.actors.run import RunContext
from stacx.agents.chat import ChatFormat
from stacx.agents.formats import CallFormat
from stacx.agents.loop import AgentConfig, loop_agents
from stacx.agents.policies import ScriptedPolicy, always
from stacx.errors import SandboxError
from stacx.events import (
    EpisodeStarted,
    Event,
    FailureKind,
    RewardAssigned,
    TaskScheduled,
    derive_id,
)
from stacx.harbor.tasks import load_task
from stacx.launch.presets import eval_recipe, run_eval
from stacx.launch.scripted import SOLVE_COMMAND, scripted_executors
from stacx.ports import AgentResult, InfraFailure
from stacx.rollout import report
from stacx.rollout.episode import EpisodeSpec, run_episode
from stacx.rollout.manager import RolloutConfig, RolloutManager
from stacx.sandbox.environments import DockerEnvironments
from stacx.store.db import connect_run
from stacx.toolcalls import render_tool_call

pytestmark = pytest.mark.docker
BASIC = Path(__file__).resolve().parents[2] / "recipes" / "tasks" / "basic"


def rows(run_dir: Path, sql: str) -> list[tuple[object, ...]]:
    con = connect_run(run_dir)
    try:
        return con.sql(sql).fetchall()
    finally:
        con.close()


async def test_oracle_eval_scores_every_sample_and_a_rerun_adds_nothing(tmp_path: Path) -> None:
    config = eval_recipe(
        tasks=str(BASIC), agent="oracle", limit=3, n_samples=2, concurrency=3, progress="off"
    )
    result = await run_eval(config, tmp_path / "run")
    assert result.unscored == 0
    got = rows(
        tmp_path / "run",
        "SELECT task_id, sample_index, status, reward, n_turns FROM episodes ORDER BY 1, 2",
    )
    assert len(got) == 6
    assert {(r[2], r[3], r[4]) for r in got} == {("scored", 1.0, 2)}
    scores = dict(zip(result.tables[0][1][1], result.tables[0][1][2][0], strict=True))
    assert scores["pass@1"] == 1.0 and scores["pass@2"] == 1.0 and scores["tasks"] == 3
    # oracle turns are demonstrations: no logprobs, no weight version, actor oracle
    turns = rows(
        tmp_path / "run", "SELECT actor, weight_version, logprobs IS NULL FROM turn_generated"
    )
    assert set(turns) == {("oracle", None, True)}
    # one execution: the oracle's call runs the task's own solve.sh (not its text replayed)
    calls = rows(tmp_path / "run", "SELECT DISTINCT arguments_json FROM tool_called WHERE turn = 0")
    assert [json.loads(c[0]) for c in calls] == [{"command": SOLVE_COMMAND}]

    again = await run_eval(config, tmp_path / "run")
    assert again.run_id == result.run_id
    assert rows(tmp_path / "run", "SELECT count(*) FROM episode_started") == [(6,)]


async def test_redelivered_task_skips_finished_samples_and_retires_dangling_ones(
    tmp_path: Path, chat: ChatFormat
) -> None:
    task = load_task(BASIC / "write-answer-42")
    async with (
        RunContext(tmp_path / "run", recipe="test") as run,
        DockerEnvironments(run_id=run.run_id, emit=run.emit) as envs,
    ):
        group = "g1"
        # sample 0: a worker started attempt 0 and died; sample 1: already scored.
        for index in (0, 1):
            episode = derive_id(run.run_id, group, index, 0)
            await run.emit(
                EpisodeStarted(
                    run_id=run.run_id,
                    episode_id=episode,
                    task_id=task.task_id,
                    group_id=group,
                    sample_index=index,
                )
            )
        await run.emit(
            RewardAssigned(
                run_id=run.run_id, episode_id=derive_id(run.run_id, group, 1, 0), reward=0.25
            )
        )
        run.spawn(
            RolloutManager(
                config=RolloutConfig(agent="oracle"),
                envs=envs,
                make_agent=loop_agents(
                    chat, AgentConfig(), scripted_executors("oracle", chat, CallFormat())
                ),
            )
        )
        for _ in range(2):  # delivered twice (distinct event ids): must not double-count
            await run.emit(
                TaskScheduled(
                    run_id=run.run_id,
                    task_id=task.task_id,
                    task_path=task.path,
                    group_id=group,
                    n_samples=2,
                )
            )
        while (await run.query(report.PROGRESS_SQL)).column(0)[0].as_py() < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.5)
        await asyncio.sleep(2)  # give a (wrong) second run of the task time to show up
        started = (
            await run.query("SELECT sample_index, attempt FROM episode_started ORDER BY 1, 2")
        ).to_pylist()
        failed = (
            await run.query("SELECT failure_kind, attempt, will_retry, message FROM infra_failed")
        ).to_pylist()
        rewards = (
            (await run.query("SELECT reward FROM episodes WHERE status = 'scored' ORDER BY reward"))
            .column(0)
            .to_pylist()
        )
    assert started == [
        {"sample_index": 0, "attempt": 0},
        {"sample_index": 0, "attempt": 1},
        {"sample_index": 1, "attempt": 0},
    ]
    assert len(failed) == 1 and failed[0]["failure_kind"] == "internal" and failed[0]["will_retry"]
    assert "abandoned" in failed[0]["message"]
    assert rewards == [0.25, 1.0]


async def test_unbuildable_image_is_an_infra_failure_not_a_zero(tmp_path: Path) -> None:
    task = tmp_path / "tasks" / "broken-image"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "environment" / "Dockerfile").write_text("FROM stacx/base:bookworm\nRUN exit 7\n")
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (task / "instruction.md").write_text("Nothing.\n")
    (task / "task.toml").write_text('version = "1.0"\n')
    result = await run_eval(
        eval_recipe(tasks=str(tmp_path / "tasks"), agent="null", max_attempts=2, progress="off"),
        tmp_path / "run",
    )
    assert result.unscored == 1
    got = rows(
        tmp_path / "run",
        "SELECT failure_kind, attempt, will_retry FROM infra_failed ORDER BY attempt",
    )
    assert got == [("image_build", 0, True), ("image_build", 1, False)]
    assert rows(tmp_path / "run", "SELECT count(*) FROM reward_assigned") == [(0,)]
    assert rows(tmp_path / "run", "SELECT DISTINCT status FROM episodes") == [("failed",)]


async def test_sandbox_dying_mid_episode_is_retried_then_given_up(
    tmp_path: Path, chat: ChatFormat
) -> None:
    """The agent kills its container's init: the next exec fails in transport -> InfraFailed."""
    task = load_task(BASIC / "write-answer-42")
    script = [
        render_tool_call("bash", {"command": "kill -TERM 1"}),
        render_tool_call("bash", {"command": "ls"}),
    ]
    async with (
        RunContext(tmp_path / "run", recipe="test") as run,
        DockerEnvironments(run_id=run.run_id, emit=run.emit) as envs,
    ):
        run.spawn(
            RolloutManager(
                config=RolloutConfig(agent="script", max_attempts=2),
                envs=envs,
                make_agent=loop_agents(
                    chat,
                    AgentConfig(),
                    lambda _t, _i: always(ScriptedPolicy(chat, script, actor="oracle")),
                ),
            )
        )
        await run.emit(
            TaskScheduled(
                run_id=run.run_id, task_id=task.task_id, task_path=task.path, group_id="g"
            )
        )
        while (await run.query(report.PROGRESS_SQL)).column(0)[0].as_py() < 1:  # noqa: ASYNC110
            await asyncio.sleep(0.5)
        failed = (
            await run.query(
                "SELECT failure_kind, attempt, will_retry FROM infra_failed ORDER BY attempt"
            )
        ).to_pylist()
        scored = (await run.query("SELECT count(*) FROM reward_assigned")).column(0)[0].as_py()
    assert failed == [
        {"failure_kind": "exec_transport", "attempt": 0, "will_retry": True},
        {"failure_kind": "exec_transport", "attempt": 1, "will_retry": False},
    ]
    assert scored == 0


async def test_episode_timeout_stops_the_agent_and_the_verifier_still_scores(
    tmp_path: Path, chat: ChatFormat
) -> None:
    task = load_task(BASIC / "write-answer-42")
    script = [render_tool_call("bash", {"command": "sleep 60", "timeout": 120})]
    async with (
        RunContext(tmp_path / "run", recipe="test") as run,
        DockerEnvironments(run_id=run.run_id, emit=run.emit) as envs,
    ):
        run.spawn(
            RolloutManager(
                config=RolloutConfig(agent="script", episode_timeout_s=2.0),
                envs=envs,
                make_agent=loop_agents(
                    chat,
                    AgentConfig(),
                    lambda _t, _i: always(ScriptedPolicy(chat, script, actor="oracle")),
                ),
            )
        )
        await run.emit(
            TaskScheduled(
                run_id=run.run_id, task_id=task.task_id, task_path=task.path, group_id="g"
            )
        )
        while (await run.query(report.PROGRESS_SQL)).column(0)[0].as_py() < 1:  # noqa: ASYNC110
            await asyncio.sleep(0.5)
        got = (await run.query("SELECT status, stop_reason, reward FROM episodes")).to_pylist()
        finished = (await run.query("SELECT n_turns FROM episode_finished")).to_pylist()
        calls = (
            await run.query(
                "SELECT c.call_id, r.timed_out, r.error FROM tool_called c "
                "LEFT JOIN tool_returned r USING (call_id)"
            )
        ).to_pylist()
    assert got == [{"status": "scored", "stop_reason": "agent_timeout", "reward": 0.0}]
    assert finished == [{"n_turns": 1}]  # the turn that ran before the timeout is counted
    # the call the timeout cut is answered in the log, not left open
    assert [(c["timed_out"], c["error"]) for c in calls] == [
        (True, "cut by the task's agent timeout (2 s)")
    ]


class _Raises:
    """An agent whose loop raises `exc` at its first step (a bug, or a dead sandbox)."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    async def run(self, **_: object) -> AgentResult:
        raise self.exc


async def test_a_bug_propagates_and_only_infrastructure_becomes_an_infra_failure(
    tmp_path: Path,
) -> None:
    task = load_task(BASIC / "write-answer-42")
    events: list[Event] = []

    async def emit(event: Event) -> None:
        events.append(event)

    async with DockerEnvironments(run_id="bug") as envs:
        spec = EpisodeSpec(run_id="bug", task=task, group_id="g", sample_index=0, attempt=0)
        with pytest.raises(TypeError, match="our own bug"):
            await run_episode(spec, envs=envs, agent=_Raises(TypeError("our own bug")), emit=emit)
        spec = msgspec.structs.replace(spec, attempt=1)
        with pytest.raises(InfraFailure) as failure:
            await run_episode(
                spec, envs=envs, agent=_Raises(SandboxError("container gone")), emit=emit
            )
    assert failure.value.kind == FailureKind.EXEC_TRANSPORT
    assert not any(isinstance(e, RewardAssigned) for e in events)


async def test_a_task_healthcheck_gates_every_rollout(tmp_path: Path) -> None:
    """DockerEnvironments (what every rollout runs in) waits for the task's healthcheck; one
    that never passes is a START failure before the agent starts, never a score."""
    src = BASIC / "write-answer-42"
    for name, command in (("healthy", "true"), ("never-healthy", "exit 3")):
        shutil.copytree(src, tmp_path / "tasks" / name)
        toml = tmp_path / "tasks" / name / "task.toml"
        toml.write_text(
            toml.read_text() + f"\n[environment.healthcheck]\ncommand = '{command}'\n"
            "interval_sec = 0.1\nretries = 2\n"
        )
    result = await run_eval(
        eval_recipe(tasks=str(tmp_path / "tasks"), agent="oracle", max_attempts=1, progress="off"),
        tmp_path / "run",
    )
    assert result.unscored == 1
    got = rows(tmp_path / "run", "SELECT task_id, status, reward, failure_kind FROM episodes")
    assert sorted(got) == [
        ("healthy", "scored", 1.0, None),
        ("never-healthy", "failed", None, "start"),
    ]
    assert rows(
        tmp_path / "run",
        "SELECT count(*) FROM turn_generated t JOIN episodes e "
        "USING (episode_id) WHERE e.task_id = 'never-healthy'",
    ) == [(0,)]

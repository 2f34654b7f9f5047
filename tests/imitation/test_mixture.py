"""Beta-mixture roll-ins: the executor's choices, and what a real roll-in records."""

from __future__ import annotations

from pathlib import Path

import pytest

from stacx.actors.run import RunContext
from stacx.agents.chat import ChatFormat
from stacx.agents.loop import AgentConfig
from stacx.agents.policies import ScriptedPolicy
from stacx.errors import ConfigError
from stacx.events import TaskScheduled
from stacx.harbor.tasks import load_task
from stacx.imitation.config import ImitationConfig, beta_at
from stacx.imitation.mixture import MixtureExecutor, MixtureRollIn, MixtureRolloutManager
from stacx.ports import Generation, SamplingParams
from stacx.rollout.manager import RolloutConfig
from stacx.sandbox.environments import DockerEnvironments
from stacx.toolcalls import render_tool_call
from tests.imitation.conftest import BASIC, wait_for


class Named:
    def __init__(self, actor: str) -> None:
        self.actor = actor

    async def act(self, prompt_ids: list[int], params: SamplingParams) -> Generation | None:
        return None


STUDENT, TEACHER = Named("student"), Named("teacher")


@pytest.mark.parametrize("beta", [0.1, 0.5, 0.8])
def test_teacher_share_matches_beta(beta: float) -> None:
    picks = [
        MixtureExecutor(STUDENT, TEACHER, beta, f"ep{e}")(t).actor
        for e in range(400)
        for t in range(10)
    ]
    share = picks.count("teacher") / len(picks)
    # 4000 Bernoulli(beta) draws: 5 standard deviations is at most 0.04
    assert abs(share - beta) < 0.04


def test_extremes_never_call_the_other_policy() -> None:
    assert {
        MixtureExecutor(STUDENT, TEACHER, 0.0, e)(t).actor for e in range(50) for t in range(10)
    } == {"student"}
    assert {
        MixtureExecutor(STUDENT, TEACHER, 1.0, e)(t).actor for e in range(50) for t in range(10)
    } == {"teacher"}


def test_choices_depend_only_on_seed_and_turn() -> None:
    a = MixtureExecutor(STUDENT, TEACHER, 0.5, "same")
    b = MixtureExecutor(STUDENT, TEACHER, 0.5, "same")
    forward = [a(t).actor for t in range(20)]
    backward = [b(t).actor for t in reversed(range(20))][::-1]
    assert forward == backward
    assert forward != [MixtureExecutor(STUDENT, TEACHER, 0.5, "other")(t).actor for t in range(20)]


def test_beta_schedule_decays_by_iteration_and_validates() -> None:
    config = ImitationConfig(beta0=0.8, beta_decay=0.5, beta_min=0.1)
    assert [config.beta(i) for i in range(4)] == [0.8, 0.4, 0.2, 0.1]
    assert beta_at(0, 1.0, 0.0) == 1.0 and beta_at(1, 1.0, 0.0) == 0.0
    with pytest.raises(ConfigError, match=r"algorithm.imitation.beta0 = 1.5"):
        ImitationConfig(beta0=1.5)


@pytest.mark.docker
async def test_roll_in_records_who_acted_and_beta(tmp_path: Path, chat: ChatFormat) -> None:
    task = load_task(BASIC / "write-answer-42")
    bash = render_tool_call("bash", {"command": "true"})
    config = ImitationConfig(name="dagger", beta0=0.8, beta_decay=0.5)
    roll_in = MixtureRollIn(
        ScriptedPolicy(chat, [bash] * 20, "student"),
        ScriptedPolicy(chat, [bash] * 20, "teacher"),
        config,
        "seed",
    )
    rollout = RolloutConfig(concurrency=2)
    async with (
        RunContext(tmp_path / "run", recipe="test") as run,
        DockerEnvironments(run_id=run.run_id, emit=run.emit) as envs,
    ):
        run.spawn(
            MixtureRolloutManager(
                roll_in=roll_in,
                config=rollout,
                envs=envs,
                chat=chat,
                agent=AgentConfig(max_turns=5),
            )
        )
        await run.emit(
            TaskScheduled(
                run_id=run.run_id,
                task_id=task.task_id,
                task_path=str(task.path),
                group_id="g1",
                n_samples=2,
                iteration=1,
            )
        )
        done = "SELECT count(*) FROM samples WHERE done AND iteration = 1"
        assert await wait_for(run.query, done, 2, timeout=240) == 2
        await run.stop_actors()
        started = (
            await run.query(
                "SELECT episode_id, sample_index, policy, beta, iteration FROM episode_started "
                "ORDER BY sample_index"
            )
        ).to_pylist()
        actors = {
            r["episode_id"]: r["actors"]
            for r in (
                await run.query(
                    "SELECT episode_id, list(actor ORDER BY turn) AS actors FROM turn_generated "
                    "GROUP BY 1"
                )
            ).to_pylist()
        }
    assert [(r["policy"], r["beta"], r["iteration"]) for r in started] == [("mixture", 0.4, 1)] * 2
    for r in started:
        # the executor the manager built is the one with the iteration's beta and seed
        expect = MixtureExecutor(
            STUDENT, TEACHER, 0.4, roll_in.seed_for(1, task.task_id, r["sample_index"])
        )
        assert actors[r["episode_id"]] == [expect(t).actor for t in range(5)]
    assert {a for seq in actors.values() for a in seq} == {"student", "teacher"}

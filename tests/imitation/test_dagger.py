"""A DAgger iteration end to end: real model, real Docker, real run; the dataset aggregates."""

from __future__ import annotations

from pathlib import Path

import pytest

from stacx.actors.run import RunContext
from stacx.agents.chat import ChatFormat
from stacx.agents.loop import AgentConfig
from stacx.agents.policies import EnginePolicy
from stacx.imitation.config import ImitationConfig, TeacherConfig
from stacx.imitation.iteration import schedule_iteration, wait_iteration
from stacx.imitation.mixture import MixtureRollIn, MixtureRolloutManager
from stacx.imitation.teacher import TeacherActor
from stacx.inference.torch_engine import TorchEngine
from stacx.rollout.environments import DockerEnvironments
from stacx.rollout.manager import RolloutConfig
from stacx.sandbox.tasks import load_task
from tests.imitation.conftest import BASIC

pytestmark = [pytest.mark.docker, pytest.mark.model]


async def test_each_iteration_adds_labels_and_keeps_earlier_ones(
    tmp_path: Path, engine: TorchEngine, chat: ChatFormat
) -> None:
    tasks = [load_task(BASIC / "write-answer-42")]
    config = ImitationConfig(name="dagger", beta0=0.5, beta_decay=0.5)
    teacher = TeacherConfig(max_new_tokens=8, max_len=4096)
    # The same weights play both roles here: this test is about the data flow, not quality.
    roll_in = MixtureRollIn(
        EnginePolicy(engine, "student"), EnginePolicy(engine, "teacher"), config, "test"
    )
    rollout = RolloutConfig(
        concurrency=2,
        agent_config=AgentConfig(
            max_turns=2, max_new_tokens=16, temperature=1.0, seed=0, context_budget=4096
        ),
    )
    counts: list[int] = []
    async with (
        RunContext(tmp_path / "run", recipe="test") as run,
        DockerEnvironments(run_id=run.run_id, emit=run.emit) as envs,
    ):
        run.spawn(MixtureRolloutManager(roll_in=roll_in, config=rollout, envs=envs, chat=chat))
        run.spawn(TeacherActor(engine, teacher, stop_token_ids=chat.stop_token_ids, label=True))
        for iteration in (0, 1):
            await schedule_iteration(run.emit, run.run_id, tasks, iteration, n_samples=1)
            await wait_iteration(
                run.query, config, iteration, 1, teacher.label_actors, timeout_s=300, poll_s=0.5
            )
            counts.append(
                int((await run.query("SELECT count(*) FROM dagger_dataset")).column(0)[0].as_py())
            )
        await run.stop_actors()
        by_iteration = {
            r["iteration"]: r["n"]
            for r in (
                await run.query("SELECT iteration, count(*) AS n FROM dagger_dataset GROUP BY 1")
            ).to_pylist()
        }
        visited = (
            (
                await run.query(
                    "SELECT count(*) FROM turn_generated t JOIN episode_started s USING (episode_id)"
                )
            )
            .column(0)[0]
            .as_py()
        )
        matches = (
            (await run.query("SELECT bool_and(prompt_matches) FROM dagger_dataset"))
            .column(0)[0]
            .as_py()
        )
    assert 0 < counts[0] < counts[1]
    # union over iterations: iteration 0's labels are all still there after iteration 1
    assert by_iteration[0] == counts[0] and by_iteration[0] + by_iteration[1] == counts[1]
    assert counts[1] == visited  # every visited state (student- or teacher-executed) labeled
    assert matches is True

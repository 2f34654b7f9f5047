"""The verifier against real containers, on the path rollouts take: `run_episode` over
`DockerEnvironments` (its `verify`), with an agent that runs one shell command. Rewards and
metrics as RewardAssigned records them, each failure kind as the InfraFailure the rollout
manager records as InfraFailed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from stacx.events import Emit, FailureKind, RewardAssigned, StopReason
from stacx.harbor.tasks import load_task
from stacx.ports import AgentResult, InfraFailure, Sandbox, Verdict
from stacx.rollout.episode import EpisodeSpec, run_episode
from stacx.sandbox.environments import DockerEnvironments

from .conftest import Recorder, make_task

pytestmark = pytest.mark.docker

Outcome = Verdict | InfraFailure
RunTask = Callable[..., Awaitable[Outcome]]


class ShellAgent:
    """An `Agent` that runs one command in the sandbox (the agent's side of a test), then stops."""

    def __init__(self, command: str | None) -> None:
        self.command = command

    async def run(
        self, *, run_id: str, episode_id: str, instruction: str, sandbox: Sandbox, emit: Emit
    ) -> AgentResult:
        if self.command:
            await sandbox.exec(self.command)
        return AgentResult(stop_reason=StopReason.SUBMITTED, n_turns=0, transcript_ids=[])


@pytest.fixture
async def run_task(tmp_path: Path, base_image: str, emitted: Recorder) -> AsyncIterator[RunTask]:
    """Run one episode of a small task (built and started by the environments), with
    `agent_cmd` as the agent; its Verdict, or the InfraFailure the episode raised."""
    async with DockerEnvironments(run_id="run-v", artifacts_dir=tmp_path / "artifacts") as envs:

        async def run(
            test_sh: str,
            *,
            toml: str = "",
            agent_cmd: str | None = None,
            dockerfile: str = "FROM debian:bookworm\nWORKDIR /app\n",
        ) -> Outcome:
            path = make_task(tmp_path, "t", test_sh=test_sh, toml=toml, dockerfile=dockerfile)
            spec = EpisodeSpec(
                run_id="run-v",
                task=load_task(path),
                group_id="g",
                sample_index=0,
                attempt=0,
                agent="shell",
            )
            try:
                _, verdict = await run_episode(
                    spec, envs=envs, agent=ShellAgent(agent_cmd), emit=emitted
                )
            except InfraFailure as exc:
                return exc
            return verdict

        yield run


async def test_reward_json_metrics_are_all_recorded(run_task: RunTask, emitted: Recorder) -> None:
    outcome = await run_task(
        """echo '{"reward": 0.5, "passed": 2, "total": 4}' > /logs/verifier/reward.json"""
    )
    assert isinstance(outcome, Verdict) and outcome.reward == 0.5
    (event,) = emitted.of(RewardAssigned)
    assert event.reward == 0.5  # type: ignore[attr-defined]
    metrics = json.loads(event.metrics_json)  # type: ignore[attr-defined]
    assert metrics == {"passed": 2.0, "reward": 0.5, "total": 4.0}
    assert outcome.metrics == {"passed": 2.0, "total": 4.0}


async def test_verifier_env_is_templated_from_host(
    run_task: RunTask, emitted: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STACX_TEST_EXPECTED", "0.25")
    outcome = await run_task(
        'echo "$EXPECTED" > /logs/verifier/reward.txt',
        toml='[verifier.env]\nEXPECTED = "${STACX_TEST_EXPECTED}"\n',
    )
    assert isinstance(outcome, Verdict) and outcome.reward == 0.25


async def test_missing_reward_is_a_failure_event_not_zero(
    run_task: RunTask, emitted: Recorder
) -> None:
    outcome = await run_task("echo 'forgot the reward'; exit 1")
    assert isinstance(outcome, InfraFailure)
    assert outcome.kind == FailureKind.VERIFIER_NO_REWARD and "neither" in outcome.message
    assert "forgot the reward" in outcome.message  # the script's output goes with it
    assert emitted.of(RewardAssigned) == []


async def test_garbled_reward_is_a_failure_with_reason(run_task: RunTask) -> None:
    outcome = await run_task("echo 'PASSED' > /logs/verifier/reward.txt")
    assert isinstance(outcome, InfraFailure)
    assert outcome.kind == FailureKind.VERIFIER_NO_REWARD and "PASSED" in outcome.message


async def test_verifier_outliving_timeout_is_its_own_kind(
    run_task: RunTask, emitted: Recorder
) -> None:
    outcome = await run_task(
        "echo 1 > /logs/verifier/reward.txt; sleep 600", toml="[verifier]\ntimeout_sec = 1\n"
    )
    assert isinstance(outcome, InfraFailure) and outcome.kind == FailureKind.VERIFIER_TIMEOUT
    assert emitted.of(RewardAssigned) == []


async def test_reward_planted_by_the_agent_does_not_count(run_task: RunTask) -> None:
    outcome = await run_task(
        "true  # writes no reward",
        agent_cmd="mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt",
    )
    assert isinstance(outcome, InfraFailure) and outcome.kind == FailureKind.VERIFIER_NO_REWARD


async def test_oom_killed_child_of_the_verifier_is_an_outcome(run_task: RunTask) -> None:
    # As under Harbor: the script goes on after its child dies and its reward counts.
    outcome = await run_task(
        "python3 -c 'b = bytearray(400 * 2**20)'; echo 1 > /logs/verifier/reward.txt",
        toml="[environment]\nmemory_mb = 128\n",
    )
    assert isinstance(outcome, Verdict) and outcome.reward == 1.0
    assert "OOM killer fired" in outcome.output


async def test_oom_in_verifier_without_a_reward_is_recorded_as_oom(run_task: RunTask) -> None:
    outcome = await run_task(
        "python3 -c 'b = bytearray(400 * 2**20)'", toml="[environment]\nmemory_mb = 128\n"
    )
    assert isinstance(outcome, InfraFailure) and outcome.kind == FailureKind.OOM


async def test_fork_bomb_in_verifier_without_a_reward_is_recorded_as_pids_limit(
    run_task: RunTask,
) -> None:
    outcome = await run_task(":(){ :|:& };:\nsleep 2\n", toml="[verifier]\ntimeout_sec = 20\n")
    assert isinstance(outcome, InfraFailure) and outcome.kind == FailureKind.PIDS_LIMIT


async def test_fork_bomb_in_a_verifier_that_still_scores_is_an_outcome(run_task: RunTask) -> None:
    outcome = await run_task(
        ":(){ :|:& };:\nsleep 2\necho 1 > /logs/verifier/reward.txt",
        toml="[verifier]\ntimeout_sec = 20\n",
    )
    assert isinstance(outcome, Verdict) and outcome.reward == 1.0
    assert "pids limit" in outcome.output


async def test_non_root_image_user_can_write_the_reward(run_task: RunTask) -> None:
    outcome = await run_task(
        '[ "$(id -un)" = agent ] && echo 1 > /logs/verifier/reward.txt',
        dockerfile="FROM debian:bookworm\nRUN useradd -m agent\nUSER agent\nWORKDIR /home/agent\n",
    )
    assert isinstance(outcome, Verdict) and outcome.reward == 1.0


async def test_agent_that_deleted_its_workdir_is_scored_not_an_infra_failure(
    run_task: RunTask,
) -> None:
    # A model ran `rm -r /app`: docker exec cannot chdir there, yet the tests must still run.
    outcome = await run_task(
        "test -e /app/keep.txt && echo 1 > /logs/verifier/reward.txt"
        " || echo 0 > /logs/verifier/reward.txt",
        agent_cmd="bash -c 'cd / && rm -rf /app'",
    )
    assert isinstance(outcome, Verdict) and outcome.reward == 0.0

"""Graders: what turns a replayed episode into a new reward, and the name it is recorded under. A
`Grader`'s ``name(task)`` must change whenever what it computes can (it is part of the event ids);
``grade`` raises `InfraFailure`, recorded as ``EpisodeNotRegraded(infra)``, never a 0.
Design: docs/regrade.md
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import msgspec

from stacx.harbor.tasks import verifier_separate
from stacx.ports import Environments, Sandbox, Task, Verdict
from stacx.sandbox.answers import is_answer_task
from stacx.sandbox.remote_wire import task_digest
from stacx.store.episodes_io import EpisodeRecord


@dataclass(frozen=True)
class Replayed:
    """One episode to grade: its events, the task, and for a replaying grader the sandbox the replay
    left (started under ``sandbox_id``, so its events never mix with the episode's)."""

    record: EpisodeRecord
    task: Task
    sandbox: Sandbox | None
    sandbox_id: str
    artifacts: Path | None = None  # set when graded from the episode's kept artifacts


class Grader(Protocol):
    replays: bool  # needs the replayed sandbox (a verifier); False: the transcript alone (a judge)

    # RewardAssigned.grader and part of the event ids: one grader grades an episode once
    def name(self, task: Task) -> str: ...

    # grade from the episode's kept artifacts instead of a replay (nothing can diverge)
    def from_artifacts(self, task: Task, kept: Path) -> bool: ...

    async def grade(self, replayed: Replayed) -> Verdict: ...


@runtime_checkable
class VerifiesArtifacts(Protocol):
    """Environments that run a task's separate verifier on kept artifacts (DockerEnvironments)."""

    async def verify_artifacts(self, task: Task, kept: Path, *, episode_id: str) -> Verdict: ...


def verifier_digest(task: Task) -> str:
    """What a task's verifier computes from: its tests directory, [verifier] table and metadata."""
    h = hashlib.sha256(task_digest(task.tests_dir).encode())
    h.update(msgspec.json.encode(task.config.verifier))
    h.update(msgspec.json.encode(task.config.metadata))
    return h.hexdigest()[:12]


class VerifierGrader:
    """The task's own verifier, in the replayed sandbox or on kept artifacts (the run's backend)."""

    replays = True

    def __init__(self, envs: Environments) -> None:
        self.envs = envs

    def name(self, task: Task) -> str:
        """``verifier:<tests dir>@<digest>``; an answer task's check: ``answer:<file#id>@..``."""
        if is_answer_task(task):
            return f"answer:{task.path}@{verifier_digest(task)}"
        return f"verifier:{task.tests_dir}@{verifier_digest(task)}"

    def from_artifacts(self, task: Task, kept: Path) -> bool:
        return (
            bool(task.config.artifacts)
            and verifier_separate(task.config)
            and kept.is_dir()
            and isinstance(self.envs, VerifiesArtifacts)
        )

    async def grade(self, replayed: Replayed) -> Verdict:
        if replayed.artifacts is not None:
            assert isinstance(self.envs, VerifiesArtifacts)
            return await self.envs.verify_artifacts(
                replayed.task, replayed.artifacts, episode_id=replayed.sandbox_id
            )
        assert replayed.sandbox is not None, "a verifier grades the replayed sandbox"
        return await self.envs.verify(
            replayed.sandbox, replayed.task, episode_id=replayed.sandbox_id
        )

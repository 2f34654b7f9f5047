"""Graders: what turns a replayed episode into a new reward, and the name it is recorded under.

A `Grader` is a structural Protocol with two parts:

- ``name(task)``: the grader's identity for one task, recorded as ``RewardAssigned.grader``
  and ``EpisodeNotRegraded.grader``, and part of the event ids, so that one grader grades an
  episode at most once (a rerun of the same regrade changes nothing) while a changed grader
  (other tests, another rubric) is a new name and a new grade. It must change whenever what
  the grader computes can change: `VerifierGrader` digests the tests directory, the
  task's ``[verifier]`` table and its metadata.
- ``grade(replayed)``: the `Verdict` for one episode. ``replays`` says whether it needs the
  episode's final state: a verifier does (it runs in the sandbox where the recorded actions
  were replayed); a grader of the transcript alone (a judge) gets ``sandbox = None`` and
  no sandbox is started for it.
- ``from_artifacts(task, kept)``: whether the episode is graded from the artifacts it left
  (``<run>/artifacts/<episode>``) instead of a replay: `VerifierGrader` does so for a task that
  declares artifacts and whose verifier is separate (it never sees more than the artifacts),
  where the run's environments can (Docker); then no action is replayed, so nothing can
  diverge, and even an installed scaffold's episode is graded.

Raises: `InfraFailure` (the sandbox or the grader's engine failed): recorded as
``EpisodeNotRegraded(issue = "infra")``, never a reward of 0.

The judge: `stacx.regrade.judging.JudgeGrader` wraps a `VerifierGrader` and joins a rubric's
judge score to its verdict (``--rubric``, a task's rubric, the recipe's ``judge.rubric``).
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
    """One episode, ready to grade: its record from the log (every event, in stream order),
    the task it is graded against, and, for a grader that replays, the sandbox holding the
    state the replayed actions left (started under ``sandbox_id``, not the episode's id, so
    the replay's artifacts and sandbox events never mix with the episode's own)."""

    record: EpisodeRecord
    task: Task
    sandbox: Sandbox | None
    sandbox_id: str
    artifacts: Path | None = None  # set when graded from the episode's kept artifacts


class Grader(Protocol):
    replays: bool

    def name(self, task: Task) -> str: ...

    def from_artifacts(self, task: Task, kept: Path) -> bool: ...

    async def grade(self, replayed: Replayed) -> Verdict: ...


@runtime_checkable
class VerifiesArtifacts(Protocol):
    """Environments that run a task's separate verifier on kept artifacts (DockerEnvironments)."""

    async def verify_artifacts(self, task: Task, kept: Path, *, episode_id: str) -> Verdict: ...


def verifier_digest(task: Task) -> str:
    """What a task's verifier computes from: its tests directory, its [verifier] table and its
    metadata (where an answer task keeps the expected answer)."""
    h = hashlib.sha256(task_digest(task.tests_dir).encode())
    h.update(msgspec.json.encode(task.config.verifier))
    h.update(msgspec.json.encode(task.config.metadata))
    return h.hexdigest()[:12]


class VerifierGrader:
    """The task's own verifier (tests/test.sh, or an answer task's check), run through the
    environments of the run's sandbox backend in the replayed sandbox."""

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

"""The judge grader of `stacx regrade`: a task's verifier and a rubric's judge combined by the
rubric's ``[combine]``, exactly as a rollout does. Guarantees: judged files are read before the
verifier runs; every judge call is a ``JudgeScored`` of the episode; another rubric, rubric text or
judge is a new grader name; no score is ``InfraFailure(judge)``, never a 0. Limits: always replays;
one judge engine per regrade.
Design: docs/regrade.md
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

import msgspec

from stacx.errors import ConfigError, TaskError
from stacx.events import Emit
from stacx.judge import JudgeModel, score
from stacx.launch.judges import open_judge
from stacx.launch.loader import ConfigDict, apply_overrides, convert
from stacx.launch.placement import ActorEnv
from stacx.launch.recipe import Recipe
from stacx.ports import Environments, Task, Verdict
from stacx.regrade.graders import Grader, Replayed, VerifierGrader
from stacx.rollout.episode import judge_events, read_answers, with_judge
from stacx.rubric import Rubric, load_rubric


def rubric_digest(rubric: Rubric) -> str:
    """What the judge computes from: the rubric's content (criteria, settings, reference, rule)."""
    text = msgspec.json.encode(msgspec.structs.replace(rubric, path=""))
    return hashlib.sha256(text).hexdigest()[:12]


def judge_label(recipe: Recipe) -> str:
    """The judge model in a grader's name: its path or URL, or the teacher's path."""
    j = recipe.judge
    if j.use == "teacher":
        return f"teacher:{recipe.teacher.path}"
    return f"{j.backend}:{j.path or j.url}"


def judge_recipe(recorded: ConfigDict, sets: list[str], *, asked: bool) -> Recipe | None:
    """The recipe whose [judge] judges, or None when none is to be opened (``judge.use = "off"`` and
    no ``--rubric``); `sets`: ``judge.KEY=VALUE`` items."""
    for item in sets:
        if not item.startswith("judge."):
            raise ConfigError(
                f"--set {item!r}: stacx regrade takes judge.KEY=VALUE only "
                "(the judge engine; the run's other settings are as recorded)"
            )
    data = apply_overrides(recorded, sets)
    recipe = convert(data, source="the recorded recipe with --set")
    j = recipe.judge
    if j.use == "off" and not asked:
        return None
    if j.use == "student":
        raise ConfigError(
            "judge.use = 'student': a regrade runs no student engine; "
            "--set judge.use=own --set judge.path=... (or judge.url=...)"
        )
    if not j.enabled or j.use == "off":  # no judge recorded: the default model
        data = apply_overrides(data, ["judge.use=own", 'judge.path="default"'])
        recipe = convert(data, source="the recorded recipe with the default judge")
    return recipe


class JudgeGrader:
    """The verifier in the replayed sandbox plus the judge on the files the replay left."""

    replays = True

    def __init__(
        self,
        verifier: VerifierGrader,
        judge: JudgeModel,
        label: str,
        *,
        rubric: Rubric | None,
        run_id: str,
        attempt: int,
        emit: Emit,
    ) -> None:
        self.verifier, self.judge, self.label, self.rubric = verifier, judge, label, rubric
        self.run_id, self.attempt, self.emit = run_id, attempt, emit

    def rubric_of(self, task: Task) -> Rubric | None:
        return self.rubric or task.rubric or self.judge.rubric

    def name(self, task: Task) -> str:
        rubric = self.rubric_of(task)
        base = self.verifier.name(task)
        if rubric is None:
            return base
        return f"{base}+judge:{rubric.path}@{rubric_digest(rubric)}/{self.label}"

    def from_artifacts(self, task: Task, kept: Path) -> bool:
        # a judged task replays: its rubric's files are read from the replayed sandbox
        return self.rubric_of(task) is None and self.verifier.from_artifacts(task, kept)

    async def grade(self, replayed: Replayed) -> Verdict:
        rubric = self.rubric_of(replayed.task)
        if rubric is None:
            return await self.verifier.grade(replayed)
        assert replayed.sandbox is not None, "a judged episode is graded in its replayed sandbox"
        answers = await read_answers(replayed.sandbox, rubric)  # before the verifier, as a rollout
        verdict = await self.verifier.grade(replayed)
        episode = replayed.record.episode_id
        result = await score(rubric, replayed.task.instruction, answers, self.judge, seed=episode)
        key = (self.name(replayed.task), self.attempt)
        for event in judge_events(self.run_id, episode, rubric, result, key=key):
            await self.emit(event)
        return with_judge(rubric, verdict, result)  # InfraFailure(judge) when it gave no score


class JudgePlan(msgspec.Struct, frozen=True, kw_only=True):
    """What a regrade judges with, checked before it starts: the parsed ``--rubric`` and the recipe
    whose [judge] is opened (None: the verifiers alone)."""

    rubric: Rubric | None
    recipe: Recipe | None


def judge_plan(
    recorded: ConfigDict, tasks: list[Task], rubric: Path | None, judge_sets: list[str]
) -> JudgePlan:
    """The plan for `tasks`; a ConfigError naming ``--rubric`` or the wrong ``--set`` item."""
    given = None
    if rubric is not None:
        try:
            given = load_rubric(rubric)
        except TaskError as exc:
            raise ConfigError(f"--rubric: {exc}") from exc
    recipe = judge_recipe(recorded, judge_sets, asked=given is not None)
    judged = given is not None or any(t.rubric for t in tasks)  # a --rubric, a task's rubric
    if recipe is not None and not (judged or recipe.judge.rubric):
        recipe = None
    return JudgePlan(rubric=given, recipe=recipe)


async def open_grader(
    stack: contextlib.AsyncExitStack,
    envs: Environments,
    env: ActorEnv,
    plan: JudgePlan,
    *,
    attempt: int,
) -> Grader:
    """`JudgeGrader` (closed with `stack`) if the plan names a judge, else `VerifierGrader`."""
    verifier = VerifierGrader(envs)
    if plan.recipe is None:
        return verifier
    judge = await open_judge(stack, plan.recipe, env)
    assert judge is not None  # judge_recipe always names one
    return JudgeGrader(
        verifier,
        judge,
        judge_label(plan.recipe),
        rubric=plan.rubric,
        run_id=env.run_id,
        attempt=attempt,
        emit=env.emit,
    )

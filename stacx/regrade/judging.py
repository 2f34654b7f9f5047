"""The judge grader of `stacx regrade`: a task's verifier and a rubric's judge, combined by the
rubric's ``[combine]`` rule, exactly as a rollout combines them (stacx.rollout.episode).

Which rubric grades an episode: ``--rubric FILE`` (every selected episode), else the task's own
(``[verifier.stacx] rubric`` of the recorded task, or of its copy in ``--tasks DIR``), else the
recorded recipe's ``judge.rubric``; an episode none applies to is graded by its verifier alone
(`VerifierGrader`, under the verifier's name).

Which model judges: the run's recorded ``[judge]`` with the ``--set judge.KEY=VALUE`` overrides,
opened by `stacx.launch.judges.open_judge` (its own checkpoint or server, or the teacher's
settings; ``use = "student"`` is refused: a regrade runs no student engine). When that names no
judge, the default model judges; except that a run recorded (or overridden) with
``judge.use = "off"`` keeps its verifier-only grades unless ``--rubric`` asks for a judge.

Guarantees: the judged files are read from the replayed sandbox before the verifier runs (as in
a rollout); every judge call is a ``JudgeScored`` event of the episode (ids keyed by the grader
and the regrade's attempt, so they never collide with the rollout's); the grader's name is
``<verifier name>+judge:<rubric file>@<rubric digest>/<judge>``, so another rubric, another
rubric text or another judge model is a new grade, and the same one grades an episode once.
A judge that gives no score raises InfraFailure(judge): recorded as EpisodeNotRegraded(infra),
never a reward of 0. Limits: the judge grader always replays (it does not read the rubric's
files from kept artifacts), and the judge engine is opened once per regrade.
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
    """The recipe whose [judge] judges (see the module docstring), or None when no judge is to
    be opened (``judge.use = "off"`` and no ``--rubric``). `sets`: ``judge.KEY=VALUE`` items."""
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


def needs_judge(tasks: list[Task], rubric: Rubric | None, recipe: Recipe) -> bool:
    """Whether any selected episode is judged (a --rubric, a task's rubric, judge.rubric)."""
    return rubric is not None or bool(recipe.judge.rubric) or any(t.rubric for t in tasks)


class JudgePlan(msgspec.Struct, frozen=True, kw_only=True):
    """What a regrade judges with, checked before it starts: the ``--rubric`` (parsed) and the
    recipe whose [judge] is opened (None: the verifiers alone)."""

    rubric: Rubric | None
    recipe: Recipe | None


def judge_plan(
    recorded: ConfigDict, tasks: list[Task], rubric: Path | None, judge_sets: list[str]
) -> JudgePlan:
    """The plan for `tasks` (the selected episodes'): a ConfigError naming ``--rubric`` or the
    ``--set`` item when one is wrong."""
    given = None
    if rubric is not None:
        try:
            given = load_rubric(rubric)
        except TaskError as exc:
            raise ConfigError(f"--rubric: {exc}") from exc
    recipe = judge_recipe(recorded, judge_sets, asked=given is not None)
    if recipe is not None and not needs_judge(tasks, given, recipe):
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
    """The regrade's grader: `JudgeGrader` (its judge engine closed with `stack`) when the plan
    names a judge, else `VerifierGrader`."""
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

"""The recipe's judge: its rubric (``judge.rubric``) and its engine (``[judge]``), for the
rollout workers (stacx.judge scores; stacx.rollout.episode calls it).

Which Engine judges is the recipe's choice (``judge.use``): an engine of its own (a torch
checkpoint, an SGLang or OpenAI-compatible server), one of the ``[teacher]`` settings, or the
student engine the worker already runs. The judge engine is opened per rollout worker and closed
with it; it never loads published weights (except ``use = "student"``, which is the student).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from stacx.agents.chat import ChatFormat
from stacx.errors import ConfigError, TaskError
from stacx.judge import JudgeModel
from stacx.launch.engines import open_engine
from stacx.launch.placement import ActorEnv
from stacx.launch.recipe import Recipe
from stacx.ports import ChatTokenizer, Engine
from stacx.rubric import Rubric, load_rubric


def rubric_path(recipe: Recipe) -> Path | None:
    """Where ``judge.rubric`` is: the path as given if it exists, else relative to the task set
    (so a set's rubric can live in the set's folder). None when the recipe names none."""
    spec = recipe.judge.rubric
    if not spec:
        return None
    path = Path(spec).expanduser()
    if path.exists():
        return path
    from stacx.launch.launcher import resolve_tasks

    try:
        tasks = resolve_tasks(recipe.tasks.path)
    except ConfigError:
        return path  # the tasks' own error is reported by their check
    beside = (tasks if tasks.is_dir() else tasks.parent) / spec
    return beside if beside.exists() else path


def recipe_rubric(recipe: Recipe) -> Rubric | None:
    """The recipe's rubric, parsed; a ConfigError naming judge.rubric, the file and the key."""
    path = rubric_path(recipe)
    if path is None:
        return None
    if not path.is_file():
        raise ConfigError(f"judge.rubric = {recipe.judge.rubric!r}: no such file")
    try:
        return load_rubric(path)
    except TaskError as exc:
        raise ConfigError(f"judge.rubric: {exc}") from exc


async def open_judge(
    stack: contextlib.AsyncExitStack,
    recipe: Recipe,
    env: ActorEnv,
    student: tuple[Engine, ChatTokenizer] | None = None,
) -> JudgeModel | None:
    """The recipe's judge (closed with `stack`), or None when it names none. `student` is the
    worker's own engine and tokenizer (for ``judge.use = "student"``)."""
    j = recipe.judge
    if not j.enabled:
        return None
    if j.use == "student":
        if student is None:
            raise ConfigError("judge.use = 'student': this worker runs no student engine")
        engine, tokenizer = student
        max_len = recipe.engine.max_len
    elif j.use == "teacher":
        from stacx.launch.roles import open_teacher_engine

        engine, tokenizer = await open_teacher_engine(stack, recipe, env)
        max_len = recipe.teacher.max_len
    else:
        engine, tokenizer = await open_engine(
            stack,
            backend=j.backend,
            model=j.path,
            device=j.device,
            dtype=j.dtype,
            url=j.url,
            max_batch=j.max_batch,
            max_len=j.max_len,
            log_dir=Path(env.run_dir),
        )
        max_len = j.max_len
    return JudgeModel(
        engine,
        tokenizer,
        name=j.name,
        stop_token_ids=ChatFormat(tokenizer).stop_token_ids,
        max_len=max_len,
        rubric=recipe_rubric(recipe),
    )

"""The recipe's judge engine (``[judge]``; its rubric: stacx.launch.recipe.recipe_rubric), for
the rollout workers (stacx.judge scores; stacx.rollout.episode calls it), and its frozen teacher
engine (``[teacher]``: labels, scores, or the judge with ``judge.use = "teacher"``).

Which Engine judges is the recipe's choice (``judge.use``): an engine of its own (a torch
checkpoint, an SGLang or OpenAI-compatible server), one of the ``[teacher]`` settings, or the
student engine the worker already runs. The judge engine is opened per rollout worker and closed
with it; it never loads published weights (except ``use = "student"``, which is the student).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from stacx.agents.chat import ChatFormat
from stacx.errors import ConfigError
from stacx.judge import JudgeModel
from stacx.launch.engines import open_engine
from stacx.launch.placement import ActorEnv
from stacx.launch.recipe import Recipe, recipe_rubric
from stacx.ports import ChatTokenizer, Engine


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


async def open_teacher_engine(
    stack: contextlib.AsyncExitStack, recipe: Recipe, env: ActorEnv
) -> tuple[Engine, ChatTokenizer]:
    """The recipe's frozen teacher engine (and its tokenizer), closed with `stack`."""
    t = recipe.teacher
    if not t.path and not t.url:
        raise ConfigError(
            f"algorithm.name = {recipe.algorithm.name!r} needs teacher.path or teacher.url"
        )
    return await open_engine(
        stack,
        backend=t.backend,
        model=t.path,
        device=t.device,
        dtype="auto",
        url=t.url,
        max_batch=t.max_batch,
        max_len=t.max_len,
        log_dir=Path(env.run_dir),
    )

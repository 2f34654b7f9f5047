"""The recipe's judge engine (``[judge]``, ``judge.use``: its own, a ``[teacher]``-like engine, or
the worker's student engine), opened per rollout worker and never loading published weights (except
the student), and the frozen teacher engine (``[teacher]``).
Design: docs/judges.md
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from stacx.agents.chat import ChatFormat
from stacx.errors import ConfigError
from stacx.imitation.config import TeacherConfig
from stacx.judge import JudgeModel
from stacx.launch.engines import open_engine
from stacx.launch.placement import ActorEnv
from stacx.launch.recipe import JudgeSection, Recipe, recipe_rubric
from stacx.ports import ChatTokenizer, Engine


async def open_judge(
    stack: contextlib.AsyncExitStack,
    recipe: Recipe,
    env: ActorEnv,
    student: tuple[Engine, ChatTokenizer] | None = None,
) -> JudgeModel | None:
    """The recipe's judge (closed with `stack`), or None when it names none; `student` is the
    worker's own engine and tokenizer."""
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
        engine, tokenizer = await _open(stack, j, j.dtype, env)
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
    return await _open(stack, t, "auto", env)


async def _open(
    stack: contextlib.AsyncExitStack, s: JudgeSection | TeacherConfig, dtype: str, env: ActorEnv
) -> tuple[Engine, ChatTokenizer]:
    return await open_engine(
        stack,
        backend=s.backend,
        model=s.path,
        device=s.device,
        dtype=dtype,
        url=s.url,
        max_batch=s.max_batch,
        max_len=s.max_len,
        log_dir=Path(env.run_dir),
    )

"""Helpers for the trainer tests: real token ids from the default model's tokenizer, scored
groups emitted through a RunContext as the rollout manager would, and waits on the log."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence

from nats.js.errors import NotFoundError

from stacx import events as ev
from stacx.actors.run import RunContext


@functools.cache
def tokenizer() -> object:
    from transformers import AutoTokenizer

    from stacx.hf import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("default"))


def prompt_ids(question: str) -> list[int]:
    tok = tokenizer()
    text = tok.apply_chat_template(  # type: ignore[attr-defined]
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return text_ids(text)


def text_ids(text: str) -> list[int]:
    return list(tokenizer().encode(text, add_special_tokens=False))  # type: ignore[attr-defined]


async def emit_group(
    run: RunContext,
    group_id: str,
    rewards: Sequence[float],
    *,
    weight_version: int = 0,
    answers: Sequence[str] | None = None,
    question: str = "Say a colour.",
    finish: Sequence[bool] | None = None,
    actor: str = "student",
) -> list[str]:
    """A task with len(rewards) samples; sample i answers answers[i] and gets rewards[i].
    finish[i] False leaves sample i running (no EpisodeFinished, no reward). Returns the
    episode ids."""
    answers = answers or [f"Colour number {i}." for i in range(len(rewards))]
    finish = finish or [True] * len(rewards)
    await run.emit(
        ev.TaskScheduled(
            run_id=run.run_id,
            task_id=f"task-{group_id}",
            task_path="/x",
            group_id=group_id,
            n_samples=len(rewards),
        )
    )
    episodes = []
    for i, reward in enumerate(rewards):
        episode_id = f"{group_id}-e{i}"
        episodes.append(episode_id)
        await start_sample(
            run,
            group_id,
            i,
            answers[i],
            weight_version=weight_version,
            question=question,
            actor=actor,
        )
        if finish[i]:
            await finish_sample(run, episode_id, reward)
    return episodes


async def start_sample(
    run: RunContext,
    group_id: str,
    index: int,
    answer: str,
    *,
    weight_version: int = 0,
    question: str = "Say a colour.",
    actor: str = "student",
) -> str:
    episode_id = f"{group_id}-e{index}"
    out = [*text_ids(answer), tokenizer().eos_token_id]  # type: ignore[attr-defined]
    await run.emit(
        ev.EpisodeStarted(
            run_id=run.run_id,
            episode_id=episode_id,
            task_id=f"task-{group_id}",
            group_id=group_id,
            sample_index=index,
        )
    )
    await run.emit(
        ev.TurnGenerated(
            run_id=run.run_id,
            episode_id=episode_id,
            turn=0,
            prompt_ids=prompt_ids(question),
            output_ids=out,
            logprobs=[-2.0] * len(out),
            weight_version=weight_version if actor == "student" else None,
            actor=actor,
            finish_reason="stop",
        )
    )
    return episode_id


async def finish_sample(run: RunContext, episode_id: str, reward: float) -> None:
    await run.emit(
        ev.EpisodeFinished(
            run_id=run.run_id, episode_id=episode_id, stop_reason=ev.StopReason.SUBMITTED, n_turns=1
        )
    )
    await run.emit(ev.RewardAssigned(run_id=run.run_id, episode_id=episode_id, reward=reward))


async def until(cond: Callable[[], object], timeout: float = 120.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def until_sql(run: RunContext, sql: str, expected: object, timeout: float = 120.0) -> None:
    """Wait until the first cell of `sql` equals `expected`."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        got = (await run.query(sql)).column(0)[0].as_py()
        if got == expected:
            return
        assert asyncio.get_running_loop().time() < deadline, f"{sql}: {got!r} != {expected!r}"
        await asyncio.sleep(0.1)


async def drained(run: RunContext, consumer: str, timeout: float = 120.0) -> None:
    """Wait until the actor `consumer` has handled (acknowledged) every event it was sent."""
    assert run.js is not None
    stream = ev.stream_name(run.run_id)
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            info = await run.js.consumer_info(stream, consumer)
        except NotFoundError:  # the actor has not subscribed yet
            await asyncio.sleep(0.05)
            continue
        if info.num_pending == 0 and info.num_ack_pending == 0:
            return
        assert asyncio.get_running_loop().time() < deadline, f"{consumer} never drained: {info}"
        await asyncio.sleep(0.05)


async def column(run: RunContext, sql: str) -> list[object]:
    return (await run.query(sql)).column(0).to_pylist()

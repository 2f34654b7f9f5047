"""The judge: a model scores an answer against a rubric, as data. `score` asks once (batched) or per
criterion, re-asks after an engine error or unparseable reply, and returns every call and the
scores, or why it failed; it publishes and raises nothing (callers record ``JudgeScored`` and turn a
failure into ``FailureKind.JUDGE``, never a 0). Guarantees: sampling seeds per (seed, call,
attempt). Limits: the files' text only; a prompt over ``max_len`` fails the call.
Design: docs/judges.md
"""

from __future__ import annotations

import time
from dataclasses import KW_ONLY, dataclass, field

import msgspec

from stacx.errors import EngineError
from stacx.events import derive_id
from stacx.ports import ChatTokenizer, Engine, SamplingParams
from stacx.rubric import (
    Criterion,
    Rubric,
    aggregate,
    choices,
    parse_reply,
    prompt_messages,
    reply_prefix,
)


@dataclass
class JudgeModel:
    """A judge: an engine, its tokenizer, the ids that end its reply, its context length, and the
    rubric of the tasks that declare none."""

    engine: Engine
    tokenizer: ChatTokenizer
    _: KW_ONLY
    name: str = "judge"
    stop_token_ids: list[int] = field(default_factory=list)
    max_len: int = 8192
    rubric: Rubric | None = None


class JudgeCall(msgspec.Struct, frozen=True, kw_only=True):
    """One question to the judge and its answer (one JudgeScored event)."""

    call: int  # which question: 0 in batched mode, the criterion's index in individual mode
    attempt: int  # 0, then 1.. for the re-asks
    criteria: list[str]
    prompt_ids: list[int]
    output_ids: list[int]
    reply: str  # reply_prefix + the decoded output
    scores: dict[str, float]  # what this reply gave (possibly partial)
    error: str = ""  # why this call gave no usable scores ("" when it did)
    gen_ms: float = 0.0


class JudgeResult(msgspec.Struct, frozen=True, kw_only=True):
    """The verdict on one answer: `score` in [0, 1] and per-criterion `scores`, or `error` (`score`
    None); `calls` holds every call, failed ones included."""

    score: float | None
    scores: dict[str, float]
    calls: list[JudgeCall]
    judge: str = ""
    error: str = ""


async def score(
    rubric: Rubric,
    instruction: str,
    answers: dict[str, str],
    model: JudgeModel,
    *,
    seed: str = "",
) -> JudgeResult:
    """Score `answers` (file -> text) to `instruction` by `rubric`; `seed` makes sampling seeds."""
    groups = (
        [rubric.criterion] if rubric.judge.mode == "batched" else [[c] for c in rubric.criterion]
    )
    calls: list[JudgeCall] = []
    scores: dict[str, float] = {}
    for index, criteria in enumerate(groups):
        got, error = await _ask(rubric, criteria, instruction, answers, model, seed, index, calls)
        if error:
            return JudgeResult(
                score=None, scores=scores, calls=calls, judge=model.name, error=error
            )
        scores |= got
    return JudgeResult(
        score=aggregate(rubric, scores), scores=scores, calls=calls, judge=model.name
    )


async def _ask(
    rubric: Rubric,
    criteria: list[Criterion],
    instruction: str,
    answers: dict[str, str],
    model: JudgeModel,
    seed: str,
    index: int,
    calls: list[JudgeCall],
) -> tuple[dict[str, float], str]:
    """One question, re-asked until a reply parses or the retries are spent: (scores, "") or ({},
    the last problem); every call is appended to `calls`."""
    messages = prompt_messages(rubric, criteria, instruction, answers)
    prefix = reply_prefix(criteria)
    tok = model.tokenizer
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt = tok.encode(text + prefix, add_special_tokens=False)
    names = [c.name for c in criteria]
    j = rubric.judge
    room = model.max_len - len(prompt)
    if room < 1:
        return {}, f"the judge prompt ({len(prompt)} tokens) does not fit max_len {model.max_len}"
    problem = ""
    got: dict[str, float]
    output: list[int]
    for attempt in range(j.retries + 1):
        t0 = time.perf_counter()
        try:
            if j.decoding == "choices":
                output, reply = await _choose(criteria, prompt, prefix, model)
            else:
                params = SamplingParams(
                    max_new_tokens=min(j.max_new_tokens, room),
                    temperature=j.temperature if attempt == 0 else j.retry_temperature,
                    stop_token_ids=model.stop_token_ids,
                    seed=int(derive_id(seed, "judge", index, attempt)[:8], 16) & 0x7FFFFFFF,
                )
                (gen,) = await model.engine.generate([prompt], params)
                output = list(gen.output_ids)
                reply = prefix + tok.decode(output, skip_special_tokens=True)
        except EngineError as exc:
            output, reply, got, problem, gen_ms = [], "", {}, f"engine error: {exc}", 0.0
        else:
            got, problem = parse_reply(criteria, reply)
            gen_ms = (time.perf_counter() - t0) * 1000
        calls.append(
            JudgeCall(
                call=index,
                attempt=attempt,
                criteria=names,
                prompt_ids=prompt,
                output_ids=output,
                reply=reply,
                scores=got,
                error=problem,
                gen_ms=gen_ms,
            )
        )
        if not problem:
            return got, ""
    return {}, f"judge call {index} ({', '.join(names)}) after {j.retries + 1} attempts: {problem}"


async def _choose(
    criteria: list[Criterion], prompt: list[int], prefix: str, model: JudgeModel
) -> tuple[list[int], str]:
    """decoding = "choices": criterion by criterion, the value whose ids the judge gives the highest
    logprob after the prompt and the reply so far. Deterministic."""
    tok = model.tokenizer
    output: list[int] = []
    reply = prefix
    for k, c in enumerate(criteria):
        if k:  # the next line's "name:" (the first one ends the prompt)
            head = f"\n{c.name}:"
            output += tok.encode(head, add_special_tokens=False)
            reply += head
        best: tuple[float, str, list[int]] | None = None
        for value in choices(c):
            ids = tok.encode(f" {value}", add_special_tokens=False)
            logprob = sum(await model.engine.score(prompt + output, ids))
            if best is None or logprob > best[0]:
                best = (logprob, value, ids)
        assert best is not None  # choices() is never empty
        output += best[2]
        reply += f" {best[1]}"
    return output, reply

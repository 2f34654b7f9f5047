"""`stacx.judge.score` with the real default model (SmolLM2-135M) on CPU: a reply that never
gives a usable value is re-asked `retries` times, each call kept, and the result is a failure
(score None, the reason), which the episode runner records as InfraFailed(judge), not a 0."""

from __future__ import annotations

import contextlib

import pytest

from stacx.agents.chat import ChatFormat
from stacx.judge import JudgeModel, score
from stacx.launch.engines import open_engine
from stacx.rubric import parse_rubric

# One token cannot write a number in [0.5, 0.75] (digits are single tokens): never parseable.
RUBRIC = """
[judge]
files = ["/app/answer.md"]
decoding = "generate"
max_new_tokens = 1
retries = 2

[[criterion]]
name = "share"
description = "Which share of the question does the answer cover?"
type = "numeric"
min = 0.5
max = 0.75
"""


@pytest.mark.model
async def test_unparseable_replies_are_retried_then_fail_as_data() -> None:
    rubric = parse_rubric(RUBRIC, where="inline.toml")
    async with contextlib.AsyncExitStack() as stack:
        engine, tok = await open_engine(
            stack, backend="torch", model="default", device="cpu", dtype="auto", max_len=2048
        )
        judge = JudgeModel(engine, tok, stop_token_ids=ChatFormat(tok).stop_token_ids, max_len=2048)
        answers = {"/app/answer.md": "DNS maps names to addresses."}
        result = await score(rubric, "Explain DNS.", answers, judge, seed="ep-1")
        again = await score(rubric, "Explain DNS.", answers, judge, seed="ep-1")
    assert result.score is None and result.scores == {}
    assert (
        "after 3 attempts" in result.error and "share (a number from 0.5 to 0.75)" in result.error
    )
    assert [c.attempt for c in result.calls] == [0, 1, 2]
    for call in result.calls:
        assert len(call.output_ids) == 1 and call.prompt_ids and call.error
        assert call.reply.startswith("share:")  # the reply prefix put in the judge's mouth
    # the same seed asks the same questions: a redone episode is judged the same way
    assert [c.output_ids for c in again.calls] == [c.output_ids for c in result.calls]

"""A tool-calling scaffold from PyPI that always sends `tool_choice: "required"`: smolagents'
`ToolCallingAgent` through its `OpenAIModel` (`ApiModel._prepare_completion_kwargs` defaults to
"required" whenever there are tools), unmodified, with one tool of its own beside its
`final_answer`, against the gateway in front of the real SmolLM2 model. Every call it makes must
be answered with a call of one of its tools: the gateway picks the function the model scores
likeliest and prefills the call's opening up to its arguments (`ToolChoice.prefills`,
`pick_function`), recorded in the prompt the engine saw; the arguments are decoded under the
tool's schema (`Opening.grammar`). Left to itself after
`<tool_call>{"name": "`, the 135M model names the function "2 + 3" here.

Whether smolagents then accepts the arguments (its own check) and answers within `max_steps` is
the model's skill; this test is about the gateway's answers.
"""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from smolagents import LogLevel, OpenAIModel, ToolCallingAgent, tool

from stacx.events import Event, GatewayRefused, TurnGenerated, full_prompts
from stacx.inference.gateway import Gateway, serve_tcp
from stacx.inference.torch_engine import TorchEngine

pytestmark = pytest.mark.model

STEPS = 2


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


async def test_smolagents_required_calls_all_get_tool_calls(torch_engine: TorchEngine) -> None:
    gateway = Gateway(torch_engine, torch_engine.tokenizer, model_name="student", max_len=2048)  # type: ignore[arg-type]
    events: list[Event] = []
    sent: list[dict[str, object]] = []  # each request body as smolagents' client put it on the wire

    async def emit(event: Event) -> None:
        events.append(event)

    async with (
        serve_tcp(gateway) as url,
        gateway.episode(run_id="r", episode_id="ep", emit=emit) as ep,
    ):
        wire = openai.DefaultHttpxClient(  # the client's own HTTP client, watched
            event_hooks={"request": [lambda r: sent.append(json.loads(r.content))]}
        )
        model = OpenAIModel(
            model_id="student",
            api_base=url,
            api_key=ep.credential,
            client_kwargs={"max_retries": 0, "http_client": wire},
            temperature=0,
            max_tokens=64,
            extra_body={"return_token_ids": True},
        )
        agent = ToolCallingAgent(
            tools=[add], model=model, max_steps=STEPS, verbosity_level=LogLevel.OFF
        )
        # smolagents is synchronous: off the loop that serves the gateway and runs the engine
        await asyncio.to_thread(agent.run, "What is 2 + 3? Use the add tool.")
        wire.close()

    assert not [e for e in events if isinstance(e, GatewayRefused)]  # no call was refused
    turns = [e for e in events if isinstance(e, TurnGenerated)]
    assert len(turns) == len(sent)  # one recorded turn per request
    # each step's call went out with its tools and "required" (the call after max_steps, asking
    # for an answer in words, has neither)
    steps = [(t, body) for t, body in zip(turns, sent, strict=True) if "tools" in body]
    assert len(steps) == STEPS and all(body["tool_choice"] == "required" for _, body in steps)
    names = [[t["function"]["name"] for t in body["tools"]] for _, body in steps]
    assert names == [["add", "final_answer"]] * STEPS  # "required" of several tools
    prompts = full_prompts([(t.turn, t.prefix_len, t.prompt_ids, t.output_ids) for t in turns])
    action_steps = [s for s in agent.memory.steps if getattr(s, "model_output_message", None)]
    for (turn, _), step in zip(steps, action_steps[:STEPS], strict=True):
        # smolagents got a tool call, not text it had to parse itself, and the reply's ids are
        # the ones recorded
        reply = step.model_output_message.raw.choices[0]
        assert reply.finish_reason == "tool_calls" and reply.token_ids == turn.output_ids
        (call,) = reply.message.tool_calls
        assert call.function.name in ("add", "final_answer")
        assert isinstance(json.loads(call.function.arguments), dict)
        assert "parsing tool call" not in str(step.error)  # smolagents' text fallback: unused
        # the engine saw the prefill: the chosen function's name, up to its arguments
        prompt = torch_engine.tokenizer.decode(prompts[turn.turn])  # type: ignore[union-attr]
        assert prompt.endswith(f'<tool_call>{{"name": "{call.function.name}", "arguments":')

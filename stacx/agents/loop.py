"""The SWE agent loop: prompt -> action -> tool -> observation, token-exact, every step an event.

Per turn it emits one TurnGenerated (the exact prompt ids the policy saw, its output ids,
logprobs, weight_version, finish_reason, timing, actor) and, when the message held a call (well
formed or not), one ToolCalled/ToolReturned pair. A message with no call at all gets a format
reminder as its observation and no tool events.

Stops (StopReason): SUBMITTED (the submit tool), AGENT_DONE (a scripted policy ran out),
MAX_TURNS, CONTEXT_EXHAUSTED (the next prompt leaves less than `min_room` tokens of the
`context_budget`; generation is also capped so prompt + output never exceeds the budget).
TIMEOUT is the caller's (it cancels this coroutine). What raises: sandbox transport errors and
engine errors, i.e. infrastructure; the caller records them as InfraFailed.

Event ids of turn and tool events are derived from (episode_id, turn), so a re-publish of the
same step is de-duplicated by JetStream and the recorder.
"""

from __future__ import annotations

import msgspec

from stacx.agents import prompts
from stacx.agents.chat import ChatFormat
from stacx.agents.formats import FormatName, get_format
from stacx.agents.policies import Executor
from stacx.agents.toolcalls import MalformedCall, ToolCall
from stacx.agents.tools import Observation, ToolLimits, execute, render_observation
from stacx.events import Emit, StopReason, ToolCalled, ToolReturned, TurnGenerated, derive_id
from stacx.inference.engine import SamplingParams
from stacx.sandbox.protocol import Sandbox


class AgentConfig(msgspec.Struct, frozen=True, kw_only=True):
    max_turns: int = 10
    max_new_tokens: int = 512
    temperature: float = 0.7
    top_p: float = 1.0
    context_budget: int = 8192  # tokens; SmolLM2's context window
    min_room: int = 32  # stop when fewer tokens than this are left for an answer
    seed: int | None = None  # base sampling seed; see `turn_seed`
    format: FormatName = "tool_call"  # how actions are written; see stacx.agents.formats
    tools: ToolLimits = msgspec.field(default_factory=ToolLimits)


class AgentResult(msgspec.Struct, frozen=True, kw_only=True):
    stop_reason: StopReason
    n_turns: int
    n_tool_calls: int
    transcript_ids: list[int]  # the last prompt (or prompt + output when the episode ended)


def turn_seed(seed: int, episode_id: str, turn: int) -> int:
    """A sampling seed per (episode, turn): reproducible, yet distinct across the samples of a
    group (one shared seed would make every sample of a task identical, and pass@k moot)."""
    return int(derive_id(seed, episode_id, turn)[:8], 16)


async def run_agent(
    *,
    run_id: str,
    episode_id: str,
    instruction: str,
    sandbox: Sandbox,
    chat: ChatFormat,
    executor: Executor,
    config: AgentConfig,
    emit: Emit,
) -> AgentResult:
    """Run one episode's agent loop in `sandbox`; see the module docstring for the contract."""
    fmt = get_format(config.format)
    prefill = chat.content_ids(fmt.prefill)
    stops = fmt.stop_token_ids(chat)
    prompt = chat.start(fmt.system_prompt(), prompts.task_message(instruction)) + prefill
    n_calls = 0
    for turn in range(config.max_turns):
        room = config.context_budget - len(prompt)
        if room < config.min_room:
            return AgentResult(
                stop_reason=StopReason.CONTEXT_EXHAUSTED,
                n_turns=turn,
                n_tool_calls=n_calls,
                transcript_ids=prompt,
            )
        policy = executor(turn)
        params = SamplingParams(
            max_new_tokens=min(config.max_new_tokens, room),
            temperature=config.temperature,
            top_p=config.top_p,
            stop_token_ids=stops,
            seed=None if config.seed is None else turn_seed(config.seed, episode_id, turn),
        )
        action = await policy.act(prompt, params)
        if action is None:
            return AgentResult(
                stop_reason=StopReason.AGENT_DONE,
                n_turns=turn,
                n_tool_calls=n_calls,
                transcript_ids=prompt,
            )
        await emit(
            TurnGenerated(
                run_id=run_id,
                event_id=derive_id(episode_id, "turn", turn),
                episode_id=episode_id,
                turn=turn,
                prompt_ids=prompt,
                output_ids=action.output_ids,
                logprobs=action.logprobs,
                weight_version=action.weight_version,
                finish_reason=action.finish_reason,
                actor=policy.actor,
                engine=action.engine,
                gen_ms=action.gen_ms,
                queue_ms=action.queue_ms,
            )
        )
        transcript = prompt + action.output_ids
        parsed = fmt.parse(chat.decode(action.output_ids))
        if parsed is None:
            observation = fmt.no_call
        else:
            n_calls += 1
            obs, tool = await _call(parsed, sandbox, config.tools, run_id, episode_id, turn, emit)
            if obs.submitted:
                return AgentResult(
                    stop_reason=StopReason.SUBMITTED,
                    n_turns=turn + 1,
                    n_tool_calls=n_calls,
                    transcript_ids=transcript,
                )
            body = render_observation(obs)
            if isinstance(parsed, ToolCall) and parsed.extra_calls:
                body += prompts.extra_calls_note(parsed.extra_calls)
            observation = prompts.observation_message(tool, body)
        prompt = (
            transcript + chat.close(action.output_ids) + chat.observation(observation) + prefill
        )
    return AgentResult(
        stop_reason=StopReason.MAX_TURNS,
        n_turns=config.max_turns,
        n_tool_calls=n_calls,
        transcript_ids=prompt,
    )


async def _call(
    parsed: ToolCall | MalformedCall,
    sandbox: Sandbox,
    limits: ToolLimits,
    run_id: str,
    episode_id: str,
    turn: int,
    emit: Emit,
) -> tuple[Observation, str]:
    """Execute one call (or report a malformed one), emitting the ToolCalled/ToolReturned pair."""
    call_id = derive_id(episode_id, "call", turn)
    if isinstance(parsed, MalformedCall):
        tool, args = "invalid", msgspec.json.encode({"raw": parsed.raw}).decode()
    else:
        tool, args = parsed.name, msgspec.json.encode(parsed.arguments).decode()
    await emit(
        ToolCalled(
            run_id=run_id,
            event_id=derive_id(episode_id, "ToolCalled", turn),
            episode_id=episode_id,
            turn=turn,
            call_id=call_id,
            tool=tool,
            arguments_json=args,
        )
    )
    if isinstance(parsed, MalformedCall):
        obs = Observation(output="", error=parsed.error)
    else:
        obs = await execute(parsed, sandbox, limits)
    await emit(
        ToolReturned(
            run_id=run_id,
            event_id=derive_id(episode_id, "ToolReturned", turn),
            episode_id=episode_id,
            turn=turn,
            call_id=call_id,
            tool=tool,
            output=obs.output,
            exit_code=obs.exit_code,
            timed_out=obs.timed_out,
            truncated=obs.truncated,
            error=obs.error,
            duration_ms=obs.duration_ms,
        )
    )
    return obs, tool

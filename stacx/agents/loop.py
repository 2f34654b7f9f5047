"""The SWE agent loop: prompt -> action -> tool -> observation, token-exact, every step an event.

Per turn it emits one TurnGenerated (the exact prompt ids the policy saw, its output ids,
logprobs, weight_version, finish_reason, timing, actor; a prompt that extends the previous turn's
prompt + output, as every prompt of this loop does, is recorded as ``prefix_len`` plus its new
ids only, so an episode's log grows linearly in its turns) and, when the message held a call (well
formed or not), one ToolCalled/ToolReturned pair. A message with no call at all gets a format
reminder as its observation and no tool events.

Stops (StopReason): SUBMITTED (the submit tool), AGENT_DONE (a scripted policy ran out),
MAX_TURNS, CONTEXT_EXHAUSTED (the next prompt leaves less than `min_room` tokens of the
`context_budget`; generation is also capped so prompt + output never exceeds the budget).
TIMEOUT is the caller's (it cancels this coroutine). What raises: sandbox transport errors and
engine errors, i.e. infrastructure; the caller records them as InfraFailed.

Event ids of turn and tool events are derived from (episode_id, turn), so a re-publish of the
same step is de-duplicated by JetStream and the recorder.

`SweAgent` is this loop behind the `Agent` port (stacx.ports) that the episode runner drives;
`swe_agents` makes one per episode for the rollout manager (stacx.launch wires it in).
"""

from __future__ import annotations

import msgspec

from stacx.agents import prompts
from stacx.agents.chat import ChatFormat
from stacx.agents.formats import FormatName, get_format
from stacx.agents.policies import Action, Executor, MakeExecutor, Policy
from stacx.agents.tools import Observation, ToolLimits, ToolRun, execute, render_observation
from stacx.events import (
    Emit,
    StopReason,
    ToolCalled,
    ToolReturned,
    TurnGenerated,
    derive_id,
    prompt_split,
)
from stacx.ports import Agent, AgentResult, MakeAgent, SamplingParams, Sandbox, Task
from stacx.toolcalls import MalformedCall, ToolCall


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


def turn_seed(seed: int, episode_id: str, turn: int) -> int:
    """A sampling seed per (episode, turn): reproducible, yet distinct across the samples of a
    group (one shared seed would make every sample of a task identical, and pass@k moot)."""
    return int(derive_id(seed, episode_id, turn)[:8], 16)


async def act_and_record(
    run_id: str,
    episode_id: str,
    turn: int,
    prompt: list[int],
    policy: Policy,
    emit: Emit,
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    stop_token_ids: list[int],
    seed: int | None,
    previous_end: list[int] | None = None,
) -> Action | None:
    """One turn of any in-house agent: `policy` acts on the exact `prompt` ids, and the turn is
    recorded as its TurnGenerated (derived id, so a redo publishes the same event), storing only
    the ids after `previous_end` (the previous turn's prompt + output) when `prompt` starts with
    it. None: a scripted policy has nothing more to do (nothing is recorded)."""
    params = SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        stop_token_ids=stop_token_ids,
        seed=None if seed is None else turn_seed(seed, episode_id, turn),
    )
    action = await policy.act(prompt, params)
    if action is None:
        return None
    prefix_len, new_ids = prompt_split(prompt, previous_end or [])
    await emit(
        TurnGenerated(
            run_id=run_id,
            event_id=derive_id(episode_id, "turn", turn),
            episode_id=episode_id,
            turn=turn,
            prompt_ids=new_ids,
            prefix_len=prefix_len,
            output_ids=action.output_ids,
            logprobs=action.logprobs,
            weight_version=action.weight_version,
            finish_reason=action.finish_reason,
            actor=policy.actor,
            engine=action.engine,
            gen_ms=action.gen_ms,
            queue_ms=action.queue_ms,
            version_starts=action.version_starts,
            versions=action.versions,
        )
    )
    return action


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
    transcript: list[int] = []  # the previous turn's prompt + output
    for turn in range(config.max_turns):
        room = config.context_budget - len(prompt)
        if room < config.min_room:
            return AgentResult(
                stop_reason=StopReason.CONTEXT_EXHAUSTED,
                n_turns=turn,
                n_tool_calls=n_calls,
                transcript_ids=prompt,
            )
        action = await act_and_record(
            run_id, episode_id, turn, prompt, executor(turn), emit,
            max_new_tokens=min(config.max_new_tokens, room),
            temperature=config.temperature,
            top_p=config.top_p,
            stop_token_ids=stops,
            seed=config.seed,
            previous_end=transcript,
        )  # fmt: skip
        if action is None:
            return AgentResult(
                stop_reason=StopReason.AGENT_DONE,
                n_turns=turn,
                n_tool_calls=n_calls,
                transcript_ids=prompt,
            )
        transcript = prompt + action.output_ids
        # A scripted action may bring its own call and execution (the oracle's solve.sh):
        # its text stays the demonstration, its call is what runs (stacx.agents.policies).
        scripted = action.scripted
        parsed = scripted.call if scripted else fmt.parse(chat.decode(action.output_ids))
        if parsed is None:
            observation = fmt.no_call
        else:
            n_calls += 1
            obs, tool = await _call(
                parsed,
                sandbox,
                config.tools,
                run_id,
                episode_id,
                turn,
                emit,
                run=scripted.run if scripted else None,
            )
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
    run: ToolRun | None = None,
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
        obs = await execute(parsed, sandbox, limits, run)
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


class SweAgent:
    """The `Agent` port over `run_agent`: one episode's chat format, executor and settings."""

    def __init__(self, *, chat: ChatFormat, executor: Executor, config: AgentConfig) -> None:
        self.chat = chat
        self.executor = executor
        self.config = config

    async def run(
        self, *, run_id: str, episode_id: str, instruction: str, sandbox: Sandbox, emit: Emit
    ) -> AgentResult:
        return await run_agent(
            run_id=run_id,
            episode_id=episode_id,
            instruction=instruction,
            sandbox=sandbox,
            chat=self.chat,
            executor=self.executor,
            config=self.config,
            emit=emit,
        )


def swe_agents(chat: ChatFormat, config: AgentConfig, make_executor: MakeExecutor) -> MakeAgent:
    """The rollout manager's agent factory: a `SweAgent` per episode, on a fresh executor."""

    def make(task: Task, sample_index: int) -> Agent:
        return SweAgent(chat=chat, executor=make_executor(task, sample_index), config=config)

    return make

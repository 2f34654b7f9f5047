"""The one in-house agent loop: prompt -> reply -> tool -> observation, token-exact, every step an
event with ids derived from (episode, turn). What a reply means is a tool adapter's (`Tools`); a new
agent is a new adapter. Only infrastructure raises (sandbox transport, engine), and the caller
records it. `LoopAgent` is the loop behind the `Agent` port.

Design: docs/agents.md#the-agent-loop
"""

from __future__ import annotations

from typing import Protocol, Self

import msgspec

from stacx.agents.chat import ChatFormat
from stacx.agents.mle import MleTools
from stacx.agents.policies import Executor, MakeExecutor
from stacx.agents.retool import RetoolTools
from stacx.agents.swe import SweTools
from stacx.agents.tools import Observation, ToolLog
from stacx.events import Emit, StopReason, derive_id
from stacx.ports import (
    Agent,
    AgentResult,
    Generation,
    MakeAgent,
    SamplingParams,
    Sandbox,
    Task,
    turn_generated,
)


class Tools(Protocol):
    """A tool adapter: how an agent frames its prompt, reads a reply, acts and answers."""

    def prompt(self, chat: ChatFormat, instruction: str) -> list[int]:
        """The first prompt's ids (system, task, and the prefill)."""
        ...

    def prefill(self, chat: ChatFormat) -> list[int]:
        """Ids every assistant message starts with, part of the prompt."""
        ...

    def stop_token_ids(self, chat: ChatFormat) -> list[int]: ...

    def for_task(self, task: Task) -> Self:
        """This adapter for one task's episodes."""
        ...

    async def step(self, gen: Generation, text: str, sandbox: Sandbox, log: ToolLog) -> str | None:
        """Act on a reply (its decoded `text`), logging its call; the next observation or None."""
        ...

    async def replay(
        self, tool: str, arguments: dict[str, object], sandbox: Sandbox
    ) -> Observation | None:
        """Run a recorded call again as `step` did (regrade); None if it never reached a sandbox."""
        ...


class AgentConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The loop's settings (not task.toml's [agent] table: stacx.ports.AgentConfig)."""

    max_turns: int = 10
    max_new_tokens: int = 512
    temperature: float = 0.7
    top_p: float = 1.0
    context_budget: int = 8192  # tokens; SmolLM2's context window
    min_room: int = 32  # stop when fewer tokens than this are left for an answer
    seed: int | None = None  # base sampling seed; see `turn_seed`
    tools: SweTools | RetoolTools | MleTools = msgspec.field(default_factory=SweTools)


def turn_seed(seed: int, episode_id: str, turn: int) -> int:
    """A sampling seed per (episode, turn): reproducible, yet distinct across a group's samples."""
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
    """Run one episode's agent loop in `sandbox` (its stops: docs/agents.md)."""
    tools: Tools = config.tools
    prompt, prefill = tools.prompt(chat, instruction), tools.prefill(chat)
    stops = tools.stop_token_ids(chat)
    log = ToolLog(run_id, episode_id, emit)
    previous: list[int] = []  # the previous turn's prompt + output
    stop, n_turns = StopReason.MAX_TURNS, config.max_turns
    for turn in range(config.max_turns):
        room = config.context_budget - len(prompt)
        if room < config.min_room:
            stop, n_turns = StopReason.CONTEXT_EXHAUSTED, turn
            break
        policy = executor(turn)
        params = SamplingParams(
            max_new_tokens=min(config.max_new_tokens, room),
            temperature=config.temperature,
            top_p=config.top_p,
            stop_token_ids=stops,
            seed=None if config.seed is None else turn_seed(config.seed, episode_id, turn),
        )
        gen = await policy.act(prompt, params)
        if gen is None:
            stop, n_turns = StopReason.AGENT_DONE, turn
            break
        await emit(
            turn_generated(
                gen,
                run_id=run_id,
                episode_id=episode_id,
                turn=turn,
                prompt=prompt,
                previous_end=previous,
                actor=policy.actor,
            )
        )
        previous = prompt + gen.output_ids
        log.turn = turn
        observation = await tools.step(gen, chat.decode(gen.output_ids), sandbox, log)
        if observation is None:
            return AgentResult(
                stop_reason=StopReason.SUBMITTED, n_turns=turn + 1, transcript_ids=previous
            )
        prompt = previous + chat.close(gen.output_ids) + chat.observation(observation) + prefill
    return AgentResult(stop_reason=stop, n_turns=n_turns, transcript_ids=prompt)


class LoopAgent:
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


def loop_agents(chat: ChatFormat, config: AgentConfig, make_executor: MakeExecutor) -> MakeAgent:
    """The rollout manager's agent factory: a `LoopAgent` per episode, fitted to its task."""

    def make(task: Task, sample_index: int) -> Agent:
        fitted = msgspec.structs.replace(config, tools=config.tools.for_task(task))
        return LoopAgent(chat=chat, executor=make_executor(task, sample_index), config=fitted)

    return make

"""Who acts on a turn: an Engine (student or teacher), or a script (oracle, null), behind one
`Policy` protocol; an `Executor` picks each turn's policy (DAgger's mixture plugs in there).
Scripted replies go through the same scaffold and tokenization as a model's, so oracle episodes are
demonstrations; the oracle's execution is Harbor's own solve.sh run.

Design: docs/agents.md#the-agent-loop
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

import msgspec

from stacx.agents.chat import ChatFormat
from stacx.agents.formats import CallFormat
from stacx.agents.tools import SUBMIT, ToolRun
from stacx.events import TurnActor
from stacx.ports import Engine, Generation, SamplingParams, Task
from stacx.toolcalls import ToolCall


class ScriptedCall(msgspec.Struct, frozen=True, kw_only=True):
    """A scripted turn's own call: recorded as its ToolCalled, executed by `run` in place of the
    call its text parses to (the oracle's solve.sh)."""

    call: ToolCall
    run: ToolRun


class ScriptedGeneration(Generation, frozen=True, kw_only=True):
    """A scripted policy's Generation (no weight version), maybe bringing its own `ScriptedCall`."""

    call: ScriptedCall | None = None


class Policy(Protocol):
    actor: TurnActor

    async def act(self, prompt_ids: list[int], params: SamplingParams) -> Generation | None:
        """The next reply, or None when a scripted policy has nothing more to do."""
        ...


Executor = Callable[[int], Policy]
"""Chooses the policy that acts on turn `turn` (0-based)."""

MakeExecutor = Callable[[Task, int], Executor]
"""(task, sample_index) -> the executor of one episode (fresh per episode: scripts are stateful)."""


class EnginePolicy:
    """A model served by an Engine; engine errors propagate (they are infrastructure)."""

    def __init__(self, engine: Engine, actor: TurnActor = TurnActor.STUDENT) -> None:
        self.engine = engine
        self.actor = actor

    async def act(self, prompt_ids: list[int], params: SamplingParams) -> Generation | None:
        (gen,) = await self.engine.generate([prompt_ids], params)
        return gen if gen.engine else msgspec.structs.replace(gen, engine=self.engine.name)


class ScriptedPolicy:
    """Plays fixed assistant texts in order, then reports that it is done; each ends as a model's
    reply would, at its end-of-turn token or at a stop text in `stop_ids`."""

    def __init__(
        self,
        chat: ChatFormat,
        texts: list[str],
        actor: TurnActor,
        stop_ids: Sequence[int] = (),
        calls: Sequence[ScriptedCall | None] = (),
    ) -> None:
        self._outputs = [_scripted(chat, t, stop_ids) for t in texts]
        self._calls = list(calls) + [None] * (len(texts) - len(calls))
        self.actor = actor

    async def act(self, prompt_ids: list[int], params: SamplingParams) -> Generation | None:
        if not self._outputs:
            return None
        t0 = time.perf_counter()
        ids = self._outputs.pop(0)
        return ScriptedGeneration(
            output_ids=ids,
            logprobs=None,
            finish_reason="stop",
            weight_version=None,
            engine="script",
            gen_ms=(time.perf_counter() - t0) * 1000,
            call=self._calls.pop(0),
        )


def _scripted(chat: ChatFormat, text: str, stop_ids: Sequence[int]) -> list[int]:
    ids = chat.content_ids(text)
    return ids if ids and ids[-1] in stop_ids else [*ids, chat.end_of_turn_id]


def script_body(script: str) -> str:
    """`script` without its leading shebang, comments and blank lines: what a model should learn
    to write (a student trained on "#!/bin/bash\n# Oracle: ..." headers babbles them)."""
    lines = script.splitlines()
    while lines and (not lines[0].strip() or lines[0].lstrip().startswith("#")):
        lines.pop(0)
    return "\n".join(lines) + ("\n" if script.endswith("\n") else "")


def oracle_policy(
    chat: ChatFormat,
    solve_sh: str,
    fmt: CallFormat | None = None,
    solution: ScriptedCall | None = None,
) -> ScriptedPolicy:
    """The task's solution body as one bash call, then submit, in `fmt`; with `solution` the call
    executes the solution itself (Harbor's oracle), else the body runs through the bash tool."""
    fmt = fmt or CallFormat()
    return ScriptedPolicy(
        chat,
        [fmt.render("bash", {"command": script_body(solve_sh)}), fmt.render(SUBMIT, {})],
        actor=TurnActor.ORACLE,
        stop_ids=fmt.stop_token_ids(chat),
        calls=[solution],
    )


def null_policy(chat: ChatFormat, fmt: CallFormat | None = None) -> ScriptedPolicy:
    """Does nothing but submit (the verifier still runs): the floor every task must beat."""
    fmt = fmt or CallFormat()
    return ScriptedPolicy(
        chat, [fmt.render(SUBMIT, {})], actor=TurnActor.NULL, stop_ids=fmt.stop_token_ids(chat)
    )


def always(policy: Policy) -> Executor:
    return lambda _turn: policy

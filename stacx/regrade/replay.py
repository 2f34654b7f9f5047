"""Replaying an episode's recorded tool calls in a fresh sandbox, and telling when it diverges.

An episode's actions are its ``ToolCalled`` events (for the SWE agent shell commands and file
edits, for ReTool Python runs and the final answer), each paired with the ``ToolReturned`` the
agent saw. `replay` runs them again, in turn order, through a `RunCall` (the agent's tool
adapter, `stacx.agents.loop.Tools.replay`), and compares every observation with the recorded
one: output text, exit code, timeout flag and error (not durations). The first call that
differs ends the replay: the state the verifier would see is no longer the episode's, so the
episode is reported (`Divergence`), never regraded on a guess.

Limits: equal observations do not prove an equal state (a command that prints nothing can
still write something else); commands whose output depends on time, randomness or the network
diverge. A call whose ToolReturned is missing (the episode's timeout cut it) cannot be checked
and is a divergence.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import msgspec

from stacx.agents.tools import Observation
from stacx.ports import Sandbox
from stacx.store.episodes_io import EpisodeRecord


class RecordedCall(msgspec.Struct, frozen=True, kw_only=True):
    """One recorded call and what the agent saw back (``output`` None: no ToolReturned)."""

    turn: int
    tool: str
    arguments: dict[str, object]
    output: str | None = None
    exit_code: int | None = None
    timed_out: bool = False
    error: str = ""


class Divergence(msgspec.Struct, frozen=True, kw_only=True):
    """The first replayed call whose observation differs from the recorded one."""

    call: RecordedCall
    replayed: Observation
    message: str


RunCall = Callable[[RecordedCall, Sandbox], Awaitable[Observation | None]]
"""Runs one recorded call in a sandbox: its observation now, or None for a call that never
reached the sandbox (a malformed one), which is not compared."""


def recorded_calls(record: EpisodeRecord) -> list[RecordedCall]:
    """The episode's calls in turn order, each with its recorded observation."""
    returned: dict[tuple[int, str], dict[str, object]] = {}
    for e in record.events:
        if e["kind"] == "ToolReturned":
            returned.setdefault((int(e["turn"]), str(e["call_id"])), e)  # type: ignore[call-overload]
    calls = []
    for e in record.events:
        if e["kind"] != "ToolCalled":
            continue
        turn = int(e["turn"])  # type: ignore[call-overload]
        r = returned.get((turn, str(e["call_id"])))
        calls.append(
            RecordedCall(
                turn=turn,
                tool=str(e["tool"]),
                arguments=json.loads(str(e["arguments_json"] or "{}")),
                output=None if r is None else str(r["output"] or ""),
                exit_code=None if r is None else r["exit_code"],  # type: ignore[arg-type]
                timed_out=bool(r and r["timed_out"]),
                error="" if r is None else str(r["error"] or ""),
            )
        )
    return sorted(calls, key=lambda c: c.turn)


def difference(call: RecordedCall, obs: Observation) -> str:
    """'' when the replayed observation is the recorded one, else what differs."""
    if call.output is None:
        return f"turn {call.turn}: no recorded observation to compare (the episode's timeout cut the call)"
    parts = []
    if obs.exit_code != call.exit_code:
        parts.append(f"exit code {call.exit_code} -> {obs.exit_code}")
    if obs.timed_out != call.timed_out:
        parts.append(f"timed out {call.timed_out} -> {obs.timed_out}")
    if obs.error != call.error:
        parts.append(f"error {call.error!r:.200} -> {obs.error!r:.200}")
    if obs.output != call.output:
        parts.append(f"output {call.output!r:.200} -> {obs.output!r:.200}")
    return f"turn {call.turn} ({call.tool}): " + "; ".join(parts) if parts else ""


async def replay(
    calls: list[RecordedCall], sandbox: Sandbox, run_call: RunCall
) -> Divergence | None:
    """Run `calls` in `sandbox` in order; the first divergence, or None when every observation
    matched (the sandbox then holds the state the episode's verifier saw, as far as the
    observations can tell). Sandbox transport errors propagate (infrastructure)."""
    for call in calls:
        obs = await run_call(call, sandbox)
        if obs is None:
            continue
        message = difference(call, obs)
        if message:
            return Divergence(call=call, replayed=obs, message=message)
    return None

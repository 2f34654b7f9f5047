"""Replaying an episode's recorded tool calls in a fresh sandbox, in turn order through the agent's
tool adapter, comparing each observation (output, exit code, timeout, error) with the recorded one:
the first difference ends the replay as a `Divergence`. Limits: equal observations do not prove an
equal state; time-, randomness- or network-dependent output diverges; a call without its
ToolReturned cannot be checked and diverges.
Design: docs/regrade.md
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
    matched. Sandbox transport errors propagate."""
    for call in calls:
        obs = await run_call(call, sandbox)
        if obs is None:
            continue
        message = difference(call, obs)
        if message:
            return Divergence(call=call, replayed=obs, message=message)
    return None

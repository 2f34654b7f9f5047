"""The pure parts of regrading: the episode selection, the comparison of a replayed observation
with the recorded one, the recorded calls out of an episode's events, and what cannot be
replayed."""

from __future__ import annotations

from stacx.agents.tools import Observation
from stacx.regrade.driver import ENDED, Target, not_replayable, selection
from stacx.regrade.replay import RecordedCall, difference, recorded_calls
from stacx.store.episodes_io import EpisodeRecord

A, B = "a" * 32, "b" * 32


def test_selection_takes_ids_or_sql_and_always_ended_episodes() -> None:
    assert selection(None) == ENDED
    assert selection(f"{A}, {B}") == f"({ENDED}) AND episode_id IN ('{A}', '{B}')"
    assert selection("task_id = 'x'") == f"({ENDED}) AND (task_id = 'x')"


def test_an_equal_observation_is_no_difference_and_each_field_counts() -> None:
    call = RecordedCall(turn=2, tool="bash", arguments={}, output="hi\n[exit code 0]", exit_code=0)
    same = Observation(output="hi\n[exit code 0]", exit_code=0, duration_ms=99.0)
    assert difference(call, same) == ""  # durations are not compared
    assert "exit code 0 -> 1" in difference(
        call, Observation(output=call.output or "", exit_code=1)
    )
    assert "output" in difference(call, Observation(output="ho\n[exit code 0]", exit_code=0))
    assert "timed out" in difference(
        call, Observation(output=call.output or "", exit_code=0, timed_out=True)
    )
    assert "error" in difference(
        call, Observation(output=call.output or "", exit_code=0, error="x")
    )
    cut = RecordedCall(turn=3, tool="bash", arguments={})  # no ToolReturned: cannot be checked
    assert "no recorded observation" in difference(cut, same)


def test_recorded_calls_pair_each_call_with_its_return_in_turn_order() -> None:
    events: list[dict[str, object]] = [
        {
            "kind": "ToolCalled",
            "turn": 1,
            "call_id": "c1",
            "tool": "bash",
            "arguments_json": '{"command": "ls"}',
        },
        {
            "kind": "ToolCalled",
            "turn": 0,
            "call_id": "c0",
            "tool": "create",
            "arguments_json": '{"path": "/a", "content": "x"}',
        },
        {
            "kind": "ToolReturned",
            "turn": 0,
            "call_id": "c0",
            "output": "Wrote 1 bytes to /a.",
            "exit_code": None,
            "timed_out": False,
            "error": "",
        },
        {
            "kind": "ToolReturned",
            "turn": 1,
            "call_id": "c1",
            "output": "a\n[exit code 0]",
            "exit_code": 0,
            "timed_out": False,
            "error": "",
        },
    ]
    record = EpisodeRecord(
        run_id="r",
        episode_id=A,
        task_id="t",
        group_id="g",
        reward=1.0,
        status="scored",
        events=events,
    )
    assert recorded_calls(record) == [
        RecordedCall(
            turn=0,
            tool="create",
            arguments={"path": "/a", "content": "x"},
            output="Wrote 1 bytes to /a.",
        ),
        RecordedCall(
            turn=1, tool="bash", arguments={"command": "ls"}, output="a\n[exit code 0]", exit_code=0
        ),
    ]


def test_an_installed_scaffolds_episode_is_not_replayable() -> None:
    record = EpisodeRecord(
        run_id="r", episode_id=A, task_id="t", group_id="g", reward=0.0, status="scored", events=[]
    )
    target = Target(
        record=record, agent="installed", policy="student", task=None, recorded_task=None
    )
    assert "installed scaffold" in not_replayable(target)
    assert (
        not_replayable(
            Target(record=record, agent="swe", policy="student", task=None, recorded_task=None)
        )
        == ""
    )

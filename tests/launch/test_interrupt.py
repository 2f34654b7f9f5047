"""An interrupted run stops its role processes in a hurry: ``ProcessPlacement.stop`` of a run marked
``interrupted`` writes the hurry line to each child's stdin, and the child stops its actors after
``INTERRUPT_GRACE_S`` (in-flight work cancelled, rerun on resume) instead of ``STOP_GRACE_S`` (work
finished). The role is a real spawned process on a real NATS server, its actor a stand-in that holds
each task for ``HOLD_S`` (tests/launch/standins.py); what is checked is the outcome of the held
work, not how long the stop took."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from stacx import events as ev
from stacx.actors.run import RunContext
from stacx.launch.loader import load_recipe
from stacx.launch.plan import roles_for
from stacx.launch.processes import ProcessPlacement
from tests.launch.standins import HELD

STANDIN = Path(__file__).resolve().parent / "standin.toml"
HOLDING = [
    "placement.mode='processes'",
    "placement.builders.rollout='tests.launch.standins:holding_rollout'",
]


@pytest.mark.parametrize(("interrupted", "outcome"), [(True, "cancelled"), (False, "finished")])
async def test_a_role_process_cancels_held_work_only_when_the_run_was_interrupted(
    run_ctx: RunContext, interrupted: bool, outcome: str
) -> None:
    recipe = load_recipe(STANDIN, HOLDING)
    (rollout,) = [r for r in roles_for(recipe) if r.name == "rollout"]
    record = run_ctx.run_dir / HELD
    placement = ProcessPlacement(run_ctx, recipe)
    try:
        await placement.start(rollout)
        await run_ctx.publish(
            ev.TaskScheduled(run_id=run_ctx.run_id, task_id="t", task_path="t", group_id="g")
        )
        deadline = time.monotonic() + 30
        while not record.exists() and time.monotonic() < deadline:
            await placement.check()  # a child that died says why
            await asyncio.sleep(0.1)
        assert record.exists(), "the role process never took the task"
        if interrupted:
            run_ctx.interrupted()  # what the launcher does on Ctrl-C or SIGTERM
    finally:
        await placement.stop()
    assert record.read_text() == outcome

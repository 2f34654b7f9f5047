"""The drift and cost views (events/views/40_gateway_drift.sql, 41_episode_cost.sql) on a log
recorded through the real bus and recorder: gateway calls that rewrite their history, tools,
sandboxes, the verifier and a train step that shares its time among its episodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from stacx import events as ev
from stacx.actors.run import RunContext
from stacx.store import db


async def _log(run_dir: Path) -> str:
    async with RunContext(run_dir, recipe="views") as run:
        r = run.run_id
        for e, agent in (("a", "installed"), ("b", "swe")):  # as the launcher names them
            await run.emit(
                ev.EpisodeStarted(run_id=r, episode_id=e, task_id="t", group_id="g", agent=agent)
            )
        # the scaffold's own name comes from its exit (gateway_drift.scaffold)
        await run.emit(
            ev.ScaffoldExited(run_id=r, episode_id="a", scaffold="mini-swe-agent", exit_code=0)
        )
        gw = "gateway:torch"
        # a: call 1 extends call 0; call 2 rewrites the history (a new segment); call 3 extends 2
        for turn, prompt, out, seg in (
            (0, [1, 2], [3], 0),
            (1, [1, 2, 3, 4], [5], 0),
            (2, [9, 9], [6, 7], 1),
            (3, [9, 9, 6, 7, 8], [1], 1),
        ):
            await run.emit(
                ev.TurnGenerated(
                    run_id=r,
                    episode_id="a",
                    turn=turn,
                    prompt_ids=prompt,
                    output_ids=out,
                    engine=gw,
                    segment=seg,
                    gen_ms=10.0,
                    queue_ms=1.0,
                )
            )
        # b: an in-house agent's turns (not the gateway's): no drift row
        await run.emit(
            ev.TurnGenerated(
                run_id=r,
                episode_id="b",
                turn=0,
                prompt_ids=[1],
                output_ids=[2, 3, 4],
                engine="torch",
                gen_ms=30.0,
            )
        )
        await run.emit(
            ev.ToolReturned(
                run_id=r, episode_id="a", turn=0, call_id="c", tool="bash", duration_ms=200.0
            )
        )
        await run.emit(
            ev.SandboxStarted(
                run_id=r, sandbox_id="s", image="i", episode_id="a", start_ms=50.0, ts=100.0
            )
        )
        await run.emit(ev.SandboxStopped(run_id=r, sandbox_id="s", episode_id="a", ts=104.0))
        await run.emit(ev.RewardAssigned(run_id=r, episode_id="a", reward=1.0, verifier_ms=300.0))
        await run.emit(ev.RewardAssigned(run_id=r, episode_id="b", reward=0.0))
        # a step over both episodes: a generated 5 tokens, b 3 -> 5/8 and 3/8 of its 800 ms
        await run.emit(
            ev.TrainStepFinished(
                run_id=r,
                step=0,
                algorithm="grpo",
                loss=0.1,
                weight_version=1,
                duration_ms=800.0,
                episode_ids=["a", "b"],
            )
        )
        return r


@pytest.fixture
async def con(tmp_path: Path):  # type: ignore[no-untyped-def]
    await _log(tmp_path / "run")
    c = db.connect_run(tmp_path / "run")
    yield c
    c.close()


async def test_gateway_drift_counts_calls_that_do_not_extend_the_previous_one(con) -> None:  # type: ignore[no-untyped-def]
    [row] = con.execute(
        "select episode_id, scaffold, n_calls, n_not_extending, n_segments from gateway_episodes"
    ).fetchall()
    assert row == ("a", "mini-swe-agent", 4, 1, 2)
    [drift] = con.execute(
        "select scaffold, n_episodes, n_calls, n_not_extending, not_extending_rate, "
        "segments_per_episode from gateway_drift"
    ).fetchall()
    assert drift == (
        "mini-swe-agent",
        1,
        4,
        1,
        1 / 3,
        2.0,
    )  # 1 of the 3 calls that had a previous one


async def test_episode_cost_sums_engine_sandbox_and_trainer_time(con) -> None:  # type: ignore[no-untyped-def]
    rows = {
        r[0]: r[1:]
        for r in con.execute(
            "select episode_id, generated_tokens, engine_ms, queue_ms, sandbox_start_ms, tool_ms, verifier_ms, "
            "sandbox_ms, sandbox_alive_s, trainer_ms, n_train_steps from episode_cost"
        ).fetchall()
    }
    assert rows["a"] == (5, 40.0, 4.0, 50.0, 200.0, 300.0, 550.0, 4.0, 500.0, 1)
    assert rows["b"] == (3, 30.0, 0.0, 0.0, 0.0, 0.0, 0.0, None, 300.0, 1)

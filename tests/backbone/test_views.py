"""`episodes` and `turns` views against a hand-built log."""

from __future__ import annotations

from pathlib import Path

import msgspec

from stacx import events as ev
from stacx.actors.run import RunContext
from stacx.store import db


async def _hand_built_log(run_dir: Path, prefix: str = "") -> str:
    async with RunContext(run_dir, recipe="views") as run:
        r = run.run_id

        async def E(e: ev.Event) -> None:  # episode ids are unique across runs, as in real logs
            if prefix and hasattr(e, "episode_id"):
                e = msgspec.structs.replace(e, episode_id=prefix + e.episode_id)
            await run.emit(e)

        await E(
            ev.EpisodeStarted(run_id=r, episode_id="a", task_id="t1", group_id="g1", sample_index=0)
        )
        await E(
            ev.EpisodeStarted(run_id=r, episode_id="b", task_id="t1", group_id="g1", sample_index=1)
        )
        await E(ev.EpisodeStarted(run_id=r, episode_id="c", task_id="t2", group_id="g2"))
        await E(
            ev.EpisodeStarted(run_id=r, episode_id="d", task_id="t2", group_id="g2", sample_index=1)
        )
        await E(
            ev.TurnGenerated(
                run_id=r,
                episode_id="a",
                turn=0,
                prompt_ids=[1, 2, 3],
                output_ids=[4, 5],
                logprobs=[-0.1, -0.2],
                weight_version=0,
                finish_reason="stop",
            )
        )
        await E(
            ev.TurnGenerated(
                run_id=r,
                episode_id="a",
                turn=1,
                prompt_ids=[1, 2, 3, 4, 5, 6],
                output_ids=[7],
                logprobs=[-0.3],
                weight_version=2,
                finish_reason="length",
            )
        )
        await E(ev.ToolCalled(run_id=r, episode_id="a", turn=0, call_id="x", tool="bash"))
        await E(ev.ToolCalled(run_id=r, episode_id="a", turn=1, call_id="y", tool="submit"))
        await E(ev.EpisodeFinished(run_id=r, episode_id="a", stop_reason="submitted", n_turns=2))
        await E(ev.RewardAssigned(run_id=r, episode_id="a", reward=1.0))
        await E(ev.EpisodeFinished(run_id=r, episode_id="b", stop_reason="max_turns"))
        await E(ev.RewardAssigned(run_id=r, episode_id="b", reward=0.0))
        await E(ev.EpisodeFinished(run_id=r, episode_id="c", stop_reason="submitted"))
        await E(ev.InfraFailed(run_id=r, episode_id="c", failure_kind="verifier_timeout"))
        return r


async def test_episodes_and_turns_views(tmp_path: Path) -> None:
    run_id = await _hand_built_log(tmp_path / "run")
    con = db.connect_run(tmp_path / "run")
    rows = {
        r[0]: r[1:]
        for r in con.execute(
            "select episode_id, run_id, task_id, group_id, status, reward, n_turns, n_tool_calls, "
            "first_weight_version, last_weight_version, stop_reason, failure_kind, "
            "finished_ts >= started_ts from episodes"
        ).fetchall()
    }
    assert rows["a"] == (run_id, "t1", "g1", "scored", 1.0, 2, 2, 0, 2, "submitted", None, True)
    assert rows["b"] == (
        run_id,
        "t1",
        "g1",
        "scored",
        0.0,
        0,
        0,
        None,
        None,
        "max_turns",
        None,
        True,
    )
    # an infrastructure failure is 'failed' with no reward, never a 0
    assert rows["c"] == (
        run_id,
        "t2",
        "g2",
        "failed",
        None,
        0,
        0,
        None,
        None,
        "submitted",
        "verifier_timeout",
        True,
    )
    assert rows["d"][3:5] == ("running", None)
    turns = con.execute(
        "select episode_id, turn, n_prompt_tokens, n_output_tokens, weight_version, finish_reason "
        "from turns order by turn"
    ).fetchall()
    assert turns == [("a", 0, 3, 2, 0, "stop"), ("a", 1, 6, 1, 2, "length")]


async def test_views_over_several_attached_runs(tmp_path: Path) -> None:
    await _hand_built_log(tmp_path / "one", "one-")
    await _hand_built_log(tmp_path / "two", "two-")
    con = db.attach_runs([tmp_path / "one", tmp_path / "two"])
    n = con.execute("select count(distinct run_id), count(*) from episodes").fetchone()
    assert n == (2, 8)


async def test_a_dropped_in_view_file_is_loaded(tmp_path: Path, monkeypatch) -> None:
    await _hand_built_log(tmp_path / "run")
    views = tmp_path / "myviews"
    views.mkdir()
    (views / "90_mine.sql").write_text(
        "CREATE OR REPLACE VIEW solved AS SELECT episode_id FROM episodes WHERE reward = 1;"
    )
    monkeypatch.setenv("STACX_VIEWS_PATH", str(views))
    con = db.connect_run(tmp_path / "run")
    assert con.execute("select * from solved").fetchall() == [("a",)]

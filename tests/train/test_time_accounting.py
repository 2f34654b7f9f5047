"""The time-accounting views (events/views/50_time_accounting.sql) on a hand-built log in a
real DuckDB file: known busy intervals of the engine, the trainer, its checkpoint and the
sandboxes, split at a weight publish. (A real tiny run's log gives the same columns:
tools/bench/async_grpo.py reads them from two `stacx run`s.)"""

from __future__ import annotations

import json

import pytest

from stacx import events as ev

from .conftest import Log


def turn(eid: str, end: float, gen_s: float, n: int) -> ev.TurnGenerated:
    return ev.TurnGenerated(
        run_id="r",
        episode_id=eid,
        turn=0,
        prompt_ids=[1],
        output_ids=[2] * n,
        weight_version=0,
        gen_ms=gen_s * 1000,
        ts=end,
    )


def test_busy_and_idle_time_per_version_and_role(log: Log) -> None:
    log.write(
        ev.RunStarted(run_id="r", recipe="x", config_json="{}", ts=100.0),
        turn("a", 110.0, 5.0, 3),  # engine 105-110
        turn("b", 112.0, 4.0, 2),  # 108-112: overlaps a (one batch): island 105-112
        turn("c", 123.0, 6.0, 4),  # 117-123: spans the publish at 120
        ev.TrainStepFinished(
            run_id="r",
            step=1,
            algorithm="grpo",
            loss=0.0,
            weight_version=1,
            duration_ms=4000.0,
            ts=120.0,
            metrics_json=json.dumps({"batch_ms": 1000.0, "checkpoint_ms": 2000.0}),
        ),
        ev.WeightsPublished(run_id="r", version=1, path="/p", sha256="s", ts=120.0),
        ev.ToolReturned(
            run_id="r",
            episode_id="c",
            turn=0,
            call_id="k",
            tool="python",
            duration_ms=3000.0,
            ts=125.0,
        ),  # sandbox 122-125
        ev.RewardAssigned(
            run_id="r", episode_id="c", reward=1.0, verifier_ms=2000.0, ts=126.0
        ),  # 124-126: island 122-126, 5 sandbox-seconds
        ev.RunFinished(run_id="r", status="completed", ts=130.0),
    )
    rows = {(r["weight_version"], r["role"]): r for r in log.rows("SELECT * FROM time_accounting")}
    assert len(rows) == 8  # 2 versions x 4 roles, idle ones included
    v0, v1 = (lambda role, v=v: rows[(v, role)] for v in (0, 1))
    assert v0("engine")["window_s"] == pytest.approx(20.0)
    assert v0("engine")["busy_s"] == pytest.approx(7.0 + 3.0)  # 105-112, 117-120
    assert v0("engine")["idle_s"] == pytest.approx(10.0)
    assert v0("engine")["tokens"] == 5 and v0("engine")["tokens_per_s"] == pytest.approx(0.25)
    assert v1("engine")["busy_s"] == pytest.approx(3.0) and v1("engine")["tokens"] == 4
    assert v0("trainer")["busy_s"] == pytest.approx(7.0)  # batch + step + checkpoint: 113-120
    assert v0("checkpoint")["busy_s"] == pytest.approx(2.0)
    assert v1("trainer")["busy_s"] == 0.0 and v1("trainer")["busy_frac"] == 0.0
    assert v1("sandbox")["busy_s"] == pytest.approx(4.0)
    assert v1("sandbox")["work_s"] == pytest.approx(5.0)  # concurrent sandbox-seconds add up
    assert v1("sandbox")["busy_frac"] == pytest.approx(0.4)
    run = {r["role"]: r for r in log.rows("SELECT * FROM time_accounting_run")}
    assert run["engine"]["busy_s"] == pytest.approx(13.0)
    assert run["engine"]["busy_frac"] == pytest.approx(13.0 / 30.0)


def step(
    n: int, end: float, *, step_s: float, batch_s: float, hold_s: float
) -> ev.TrainStepFinished:
    metrics = {"batch_ms": batch_s * 1000, "hold_ms": hold_s * 1000, "checkpoint_ms": 0.0}
    return ev.TrainStepFinished(
        run_id="r",
        step=n,
        algorithm="grpo",
        loss=0.0,
        weight_version=n,
        duration_ms=step_s * 1000,
        ts=end,
        metrics_json=json.dumps(metrics),
    )


def test_background_checkpoint_time_and_the_trainer_cadence(log: Log) -> None:
    """A background write is the checkpoint role's (CheckpointSaved), not the trainer's; the
    trainer_cadence view compares the trainer's time per step with the step itself."""
    log.write(
        ev.RunStarted(run_id="r", recipe="x", config_json="{}", ts=100.0),
        step(1, 110.0, step_s=4.0, batch_s=0.5, hold_s=0.5),  # trainer 105-110
        ev.WeightsPublished(run_id="r", version=1, path="/p1", sha256="", durable=False, ts=110.0),
        step(2, 116.0, step_s=4.0, batch_s=1.0, hold_s=1.0),  # trainer 110-116
        ev.WeightsPublished(run_id="r", version=2, path="/p2", sha256="s", ts=116.0),
        ev.CheckpointSaved(
            run_id="r", version=1, path="/p1", sha256="s1", duration_ms=8000.0, ts=118.0
        ),  # 110-118, beside step 2
        ev.RunFinished(run_id="r", status="completed", ts=120.0),
    )
    rows = {(r["weight_version"], r["role"]): r for r in log.rows("SELECT * FROM time_accounting")}
    assert rows[(0, "trainer")]["busy_s"] == pytest.approx(5.0)
    assert rows[(1, "trainer")]["busy_s"] == pytest.approx(6.0)  # not the write
    assert rows[(1, "checkpoint")]["busy_s"] == pytest.approx(6.0)  # 110-116 of 110-118
    assert rows[(2, "checkpoint")]["busy_s"] == pytest.approx(2.0)
    cadence = log.rows("SELECT * FROM trainer_cadence ORDER BY step")
    assert [r["cycle_s"] for r in cadence] == pytest.approx([5.0, 6.0])
    assert [r["cycle_over_step"] for r in cadence] == pytest.approx([1.25, 1.5])
    assert cadence[1]["gap_s"] == pytest.approx(6.0)
    assert [r["durable"] for r in cadence] == [False, True]
    assert cadence[0]["write_s"] == pytest.approx(8.0) and cadence[1]["write_s"] is None
    (run,) = log.rows("SELECT * FROM trainer_cadence_run")
    assert run["cycle_over_step"] == pytest.approx(11.0 / 8.0) and run["durable_versions"] == 1

"""The Trainer actor against a real log: readiness, staleness, lineage, resume, redo.

Real NATS, real DuckDB, the real default model and tokenizer. To keep CPU time small the
trainer updates only the final norm (``trainable``): every forward pass still runs the
whole model, and checkpoints hold every weight.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from stacx import events as ev
from stacx.actors.run import RunContext
from stacx.train.config import TrainerConfig
from stacx.train.trainer import Trainer, load_model

from .test_trainer_support import column, drained, emit_group, finish_sample, until, until_sql

FAST = {"trainable": r"^model\.norm\.weight$", "lr": 1e-2, "keep_last": 0}


def config(**kw: object) -> TrainerConfig:
    return TrainerConfig(**{**FAST, **kw})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def base() -> nn.Module:
    return load_model("default", torch.device("cpu"), torch.float32)


def trainer(base: nn.Module, **kw: object) -> Trainer:
    """A trainer on a private copy of the default model (loading it once per module)."""
    return Trainer(config(**kw), model=copy.deepcopy(base))


async def test_not_ready_until_enough_complete_groups(tmp_path: Path, base: nn.Module) -> None:
    async with RunContext(tmp_path / "run") as run:
        t = trainer(base, batch_groups=2, steps=1)
        run.spawn(t)
        g1 = await emit_group(run, "g1", [1.0, 0.0])
        g2 = await emit_group(run, "g2", [0.0, 1.0], finish=[True, False])  # one still running
        await drained(run, "trainer")
        assert await column(run, "select count(*) from train_step_finished") == [0]
        assert t.version == 0
        await finish_sample(run, "g2-e1", 1.0)
        await until_sql(run, "select max(version) from weights", 1)
        steps = (await run.query("select * from train_step_finished")).to_pylist()
        assert len(steps) == 1
        assert sorted(steps[0]["episode_ids"]) == sorted(g1 + g2)
        assert steps[0]["weight_version"] == 1 and steps[0]["n_samples"] == 4
        published = (await run.query("select * from weights_published")).to_pylist()
        assert published[0]["path"].endswith("checkpoints/v1/model.safetensors")


class CountingTrainer(Trainer):
    """The real trainer, counting how often it asks the log whether a batch is ready."""

    checks = 0

    async def _next_batch(self) -> list[str] | None:
        self.checks += 1
        return await super()._next_batch()


async def test_a_burst_of_rewards_costs_one_readiness_check(
    tmp_path: Path, base: nn.Module
) -> None:
    async with RunContext(tmp_path / "run") as run:
        for g in range(6):  # 12 rewards (and 12 finishes) in the stream before the trainer reads
            await emit_group(run, f"g{g}", [1.0, 0.0])
        t = CountingTrainer(config(batch_groups=100, steps=1), model=copy.deepcopy(base))
        run.spawn(t)
        await drained(run, "trainer")
        # the first check saw the log up to the stream's head: every later event is counted in
        # it (one check per event was 12+)
        assert t.checks <= 2, t.checks
        assert t.version == 0
        before = t.checks
        await emit_group(run, "late", [1.0, 0.0])  # a new reward after that check: asked again
        await drained(run, "trainer")
        assert t.checks > before


async def test_final_infra_failure_completes_a_group_and_is_not_trained(
    tmp_path: Path, base: nn.Module
) -> None:
    async with RunContext(tmp_path / "run") as run:
        run.spawn(trainer(base, batch_groups=1, steps=1))
        await emit_group(run, "g1", [1.0, 0.0, 0.0], finish=[True, True, False])
        await drained(run, "trainer")
        assert await column(run, "select count(*) from train_step_finished") == [0]
        await run.emit(
            ev.InfraFailed(
                run_id=run.run_id,
                failure_kind=ev.FailureKind.OOM,
                episode_id="g1-e2",
                will_retry=False,
            )
        )
        await until_sql(run, "select max(version) from weights", 1)
        ids = await column(run, "select unnest(episode_ids) from train_step_finished order by 1")
        assert ids == ["g1-e0", "g1-e1"]


async def test_async_staleness_excludes_old_groups_and_stops_after_steps(
    tmp_path: Path, base: nn.Module
) -> None:
    async with RunContext(tmp_path / "run") as run:
        t = trainer(base, batch_groups=1, steps=3, mode="async", max_staleness=1)
        run.spawn(t)
        for g in ("a", "b", "c"):  # all sampled by version 0
            await emit_group(run, g, [1.0, 0.0])
        await until_sql(run, "select max(version) from weights", 2)
        await drained(run, "trainer")
        # a trains v1 (staleness 0), b trains v2 (staleness 1), c is 2 behind: excluded for good
        assert await column(run, "select max(version) from weights") == [2]
        d = await emit_group(run, "d", [0.0, 1.0], weight_version=2)
        await until_sql(run, "select max(version) from weights", 3)
        rows = (
            await run.query(
                "select weight_version, list_sort(episode_ids) as ids, metrics_json "
                "from train_step_finished order by weight_version"
            )
        ).to_pylist()
        assert [r["ids"] for r in rows] == [["a-e0", "a-e1"], ["b-e0", "b-e1"], sorted(d)]
        assert [json.loads(r["metrics_json"])["max_staleness"] for r in rows] == [0, 1, 0]
        # `steps` reached: a fresh, ready group is left alone and nothing more is published
        await emit_group(run, "e", [0.0, 1.0], weight_version=3)
        await drained(run, "trainer")
        assert t.finished
        assert await column(run, "select count(*) from weights_published") == [3]


async def test_sync_mode_trains_on_current_version_only(tmp_path: Path, base: nn.Module) -> None:
    async with RunContext(tmp_path / "run") as run:
        run.spawn(trainer(base, batch_groups=1, steps=2, mode="sync", max_staleness=5))
        await emit_group(run, "a", [1.0, 0.0])
        await emit_group(run, "b", [1.0, 0.0])  # also version 0: stale once v1 exists
        await until_sql(run, "select max(version) from weights", 1)
        await drained(run, "trainer")
        assert await column(run, "select max(version) from weights") == [1]
        await emit_group(run, "c", [1.0, 0.0], weight_version=1)
        await until_sql(run, "select max(version) from weights", 2)
        trained = await column(run, "select distinct group_id from lineage order by 1")
        assert trained == ["a", "c"]


async def test_resume_after_restart_continues_from_the_log(tmp_path: Path, base: nn.Module) -> None:
    kw = {"batch_groups": 1, "steps": 3, "mode": "async", "max_staleness": 9}
    async with RunContext(tmp_path / "run") as run:
        run.spawn(trainer(base, **kw))
        await emit_group(run, "a", [1.0, 0.0])
        await emit_group(run, "b", [0.0, 1.0])
        await until_sql(run, "select max(version) from weights", 2)
    v2 = tmp_path / "run" / "checkpoints" / "v2" / "model.safetensors"
    async with RunContext(tmp_path / "run") as run:  # a new process, as far as the log knows
        t = trainer(base, **kw)
        run.spawn(t)
        await until(lambda: t.model is not None)
        await drained(run, "trainer")
        assert t.version == 2
        assert t.model is not None and t.optimizer is not None
        from safetensors.torch import load_file

        assert torch.equal(t.model.model.norm.weight, load_file(str(v2))["model.norm.weight"])
        (adam,) = t.optimizer.state_dict()["state"].values()
        assert float(adam["step"]) == 2.0  # the optimizer state came back too
        await emit_group(run, "c", [1.0, 0.0])
        await until_sql(run, "select max(version) from weights", 3)
        rows = (
            await run.query(
                "select step, list_sort(episode_ids) as ids from train_step_finished order by step"
            )
        ).to_pylist()
    assert [(r["step"], r["ids"]) for r in rows] == [
        (1, ["a-e0", "a-e1"]),
        (2, ["b-e0", "b-e1"]),
        (3, ["c-e0", "c-e1"]),
    ]


async def test_crash_between_step_and_publish_is_redone_on_the_same_episodes(
    tmp_path: Path, base: nn.Module
) -> None:
    async with RunContext(tmp_path / "run") as run:
        # the log of a trainer that recorded step 1 on group b, then died before publishing v1
        await run.emit(
            ev.TrainStepFinished(
                run_id=run.run_id,
                event_id=ev.derive_id(run.run_id, "step", 1),
                step=1,
                algorithm="grpo",
                loss=0.0,
                weight_version=1,
                episode_ids=["b-e0", "b-e1"],
            )
        )
        await emit_group(run, "c", [1.0, 0.0])  # older than b: a fresh pick would take c
        await emit_group(run, "b", [0.0, 1.0])
        run.spawn(trainer(base, batch_groups=1, steps=1))
        await until_sql(run, "select max(version) from weights", 1)
        await drained(run, "trainer")
        assert await column(run, "select count(*) from train_step_finished") == [1]  # de-duplicated
        assert await column(
            run, "select unnest(episode_ids) from train_step_finished order by 1"
        ) == [
            "b-e0",
            "b-e1",
        ]
        assert await column(run, "select count(*) from weights_published") == [1]

"""Weight sync: WeightsPublished -> the engine loads it -> WeightsLoaded; later generations carry
the new version. Real engine (TorchEngine, default model), real trainer, real log."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from safetensors.torch import load_file

from stacx import events as ev
from stacx.actors.run import RunContext
from stacx.inference.torch_engine import TorchEngine
from stacx.ports import SamplingParams
from stacx.train.config import TrainerConfig
from stacx.train.trainer import Trainer
from stacx.weights.sync import InProcessWeights, WeightSync

from .test_trainer_support import column, emit_group, prompt_ids, until, until_sql

FAST = {"trainable": r"^model\.norm\.weight$", "lr": 1e-2, "batch_groups": 1}


@pytest.fixture
async def engine() -> AsyncIterator[TorchEngine]:
    e = TorchEngine("default", device="cpu", max_len=512)
    try:
        yield e
    finally:
        await e.close()


def engine_norm(e: TorchEngine) -> torch.Tensor:
    return e.model.state_dict()["model.norm.weight"]


@pytest.mark.parametrize("in_process", [True, False], ids=["in-memory", "from-file"])
async def test_published_weights_are_loaded_and_stamped(
    tmp_path: Path, engine: TorchEngine, in_process: bool
) -> None:
    async with RunContext(tmp_path / "run") as run:
        handoff = InProcessWeights()  # what the launcher hands both under local placement
        run.spawn(WeightSync(engine, label="e0", handoff=handoff))
        cfg = TrainerConfig(**FAST, steps=1, inprocess_handoff=in_process)
        run.spawn(Trainer(cfg, handoff=handoff))
        before = engine_norm(engine).clone()
        await emit_group(run, "g", [1.0, 0.0])
        await until_sql(run, "select count(*) from weights where engine = 'e0'", 1)
        row = (await run.query("select * from weights")).to_pylist()[0]
        assert row["version"] == 1 and row["load_latency_ms"] > 0
        assert engine.weight_version == 1
        published = load_file(row["path"])["model.norm.weight"]
        assert not torch.equal(published, before)  # the step changed something ...
        assert torch.equal(engine_norm(engine), published)  # ... and the engine serves it
        (gen,) = await engine.generate([prompt_ids("Hi")], SamplingParams(max_new_tokens=2))
        assert gen.weight_version == 1


async def test_a_digest_mismatch_is_never_loaded(tmp_path: Path, engine: TorchEngine) -> None:
    class QuickSync(WeightSync):
        max_deliver: ClassVar[int] = 2
        retry_delay: ClassVar[float] = 0.05

    weights = tmp_path / "w.safetensors"
    from safetensors.torch import save_file

    save_file({"model.norm.weight": torch.zeros(576)}, str(weights))
    handoff = InProcessWeights()
    handoff.offer("elsewhere", "x", {})  # nothing in memory for this path
    async with RunContext(tmp_path / "run") as run:
        run.spawn(QuickSync(engine, label="e0", handoff=handoff))
        await run.emit(
            ev.WeightsPublished(run_id=run.run_id, version=1, path=str(weights), sha256="0" * 64)
        )
        await until_sql(run, "select count(*) from infra_failed", 1)
        assert (
            "does not match the published"
            in (await column(run, "select message from infra_failed"))[0]
        )
        assert engine.weight_version == 0
        assert await column(run, "select count(*) from weights_loaded") == [0]
        assert not torch.equal(engine_norm(engine), torch.zeros(576))


async def test_a_restarted_engine_catches_up_with_the_log(
    tmp_path: Path, engine: TorchEngine
) -> None:
    async with RunContext(tmp_path / "run") as run:
        run.spawn(Trainer(TrainerConfig(**FAST, steps=1)))
        await emit_group(run, "g", [1.0, 0.0])
        await until_sql(run, "select max(version) from weights", 1)
    assert engine.weight_version == 0  # no sync ran in that launcher
    async with RunContext(tmp_path / "run") as run:
        s = WeightSync(engine, label="late")
        run.spawn(s)
        await until(lambda: engine.weight_version == 1)
        await until_sql(run, "select count(*) from weights_loaded where engine = 'late'", 1)

"""Per-token weight versions, end to end: the real TorchEngine (the default model on CPU) loads
a new weight version while one generation is decoding; the turn's TurnGenerated (recorded by
the one turn constructor `ports.turn_generated`, as the agent loop records it) carries both versions' change points; in a real run
database the views (`turn_versions`, `batch_token_versions`) and the trainer's batch read
(`step_batch`) see each token's version, and the per-token staleness bound masks the old ones."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from stacx import events as ev
from stacx import wire
from stacx.agents.policies import EnginePolicy
from stacx.hf import resolve_model
from stacx.inference.torch_engine import TorchEngine
from stacx.ports import SamplingParams, turn_generated
from stacx.train.config import TrainerConfig
from stacx.train.trainer import step_batch
from tests.train.conftest import Log
from tests.train.test_episode_packing import query_of

LONG = SamplingParams(max_new_tokens=160, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine() -> Iterator[TorchEngine]:
    eng = TorchEngine(resolve_model("default"), device="cpu", max_len=1024, threads=1)
    yield eng
    asyncio.run(eng.close())


async def load_mid_generation(engine: TorchEngine, coro: object) -> tuple[object, int]:
    """Run `coro` (a generation), load version v+1 once it has decoded a few steps; returns
    (its result, v). The new weights differ (the final norm scaled), so the versions are real."""
    v = engine.weight_version
    steps = engine.stats["decode_steps"]
    task = asyncio.ensure_future(coro)  # type: ignore[arg-type]
    for _ in range(4800):  # until it is decoding (at most ~4 min on a loaded machine)
        if engine.running and engine.stats["decode_steps"] >= steps + 3:
            break
        await asyncio.sleep(0.05)
    norm = engine.model.state_dict()["model.norm.weight"].clone()
    await engine.load_state({"model.norm.weight": norm * 0.5}, v + 1)
    assert not task.done()  # the load fell inside the generation
    return await task, v


async def test_a_load_mid_generation_is_recorded_per_token_and_reaches_the_batch(
    engine: TorchEngine, log: Log
) -> None:
    recorded: list[ev.Event] = []

    async def emit(event: ev.Event) -> None:
        recorded.append(event)

    prompt = engine.tokenizer("Count from one to a thousand:")["input_ids"]

    async def act_and_record() -> object:  # one turn, as stacx.agents.loop records it
        params = SamplingParams(max_new_tokens=LONG.max_new_tokens, temperature=0.0, top_p=1.0)
        gen = await EnginePolicy(engine).act(prompt, params)
        assert gen is not None
        await emit(
            turn_generated(gen, run_id="r", episode_id="e0", turn=0, prompt=prompt, previous_end=[])
        )
        return gen

    turn = act_and_record()
    action, v = await load_mid_generation(engine, turn)
    (tg,) = [e for e in recorded if isinstance(e, ev.TurnGenerated)]
    n = len(tg.output_ids)
    assert tg.versions == [v, v + 1] and tg.weight_version == v + 1
    assert tg.version_starts[0] == 0 and 0 < tg.version_starts[1] < n
    cut = tg.version_starts[1]
    # the wire form round-trips; an event without the fields (an old log) means one version
    assert wire.decode(wire.encode(tg)) == tg
    assert (
        ev.TurnGenerated(
            run_id="r", episode_id="x", turn=0, prompt_ids=[1], output_ids=[2]
        ).versions
        == []
    )

    # a scored GRPO group of two episodes: e0 (both versions), e1 (one version, v + 1)
    other = ev.TurnGenerated(
        run_id="r",
        episode_id="e1",
        turn=0,
        prompt_ids=prompt,
        output_ids=tg.output_ids[:5],
        logprobs=tg.logprobs[:5],  # type: ignore[index]
        weight_version=v + 1,
    )
    log.write(ev.TaskScheduled(run_id="r", task_id="t", task_path="/x", group_id="g", n_samples=2))
    for i, (eid, turn_ev, reward) in enumerate([("e0", tg, 1.0), ("e1", other, 0.0)]):
        log.write(
            ev.EpisodeStarted(
                run_id="r", episode_id=eid, task_id="t", group_id="g", sample_index=i
            ),
            turn_ev,
            ev.EpisodeFinished(run_id="r", episode_id=eid, stop_reason="submitted", n_turns=1),
            ev.RewardAssigned(run_id="r", episode_id=eid, reward=reward),
        )
    (row,) = log.rows("SELECT * FROM turn_versions WHERE episode_id = 'e0'")
    assert row["token_versions"] == [v] * cut + [v + 1] * (n - cut)
    assert (row["min_version"], row["max_version"]) == (v, v + 1)

    # the trainer's batch: each completion token carries its version
    cfg = TrainerConfig(algorithm="grpo", mode="async", max_staleness=1)
    batch = await step_batch(cfg, query_of(log), ["e0", "e1"], version=v + 1)
    by_len = {len(s.completion_ids): s for s in batch.samples}
    assert list(by_len[n].token_values["weight_version"]) == [v] * cut + [v + 1] * (n - cut)
    assert by_len[n].loss_mask is None or set(by_len[n].loss_mask) == {1}  # all within the bound
    # two versions later, tokens 2 behind leave the bound (max_staleness 1): masked per token
    later = await step_batch(cfg, query_of(log), ["e0", "e1"], version=v + 2)
    mask = {len(s.completion_ids): s.loss_mask for s in later.samples}
    assert mask[n] is not None and list(mask[n]) == [0] * cut + [1] * (n - cut)
    assert mask[5] is None or set(mask[5]) == {1}

    # "how many tokens of this step's batch came from a policy older than v + 1"
    log.write(
        ev.TrainStepFinished(
            run_id="r",
            step=v + 2,
            algorithm="grpo",
            loss=0.0,
            weight_version=v + 2,
            episode_ids=["e0", "e1"],
        )
    )
    (older,) = log.rows(
        "SELECT sum(n_tokens) AS n FROM batch_token_versions WHERE step = $s AND version < $v",
        {"s": v + 2, "v": v + 1},
    )
    assert older["n"] == cut
    assert action is not None

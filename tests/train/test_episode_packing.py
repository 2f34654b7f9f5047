"""Multi-turn episodes stored linearly (each turn's new prompt ids once, ``prefix_len``) and
trained as one packed sequence per episode (segment): the ``turns`` view rebuilds whole prompts
for new and old logs; the trainer's batch read (``step_batch``) rebuilds each episode's sequence
from the stored ids only, the same sequences the whole-prompt rows merge into, and an episode's
sequence gives the per-turn samples' logprobs, losses and gradients (a real tiny transformers
model, a real DuckDB log, the trainer's own functions)."""

from __future__ import annotations

import copy
import json
import random
import warnings
from pathlib import Path

import duckdb
import msgspec
import numpy as np
import pyarrow as pa
import pytest
import torch
from torch import nn
from transformers import Qwen3Config, Qwen3ForCausalLM

from stacx import events as ev
from stacx.actors.run import RunContext
from stacx.store import db
from stacx.train import units
from stacx.train.batches import chain_sequences
from stacx.train.columns import BatchError
from stacx.train.config import TrainerConfig
from stacx.train.forward import packed_token_logprobs
from stacx.train.losses import policy_gradient_loss, sft_loss
from stacx.train.packing import Sample, pack
from stacx.train.step import train_step
from stacx.train.trainer import Query, Trainer, load_model, step_batch

from .conftest import Log
from .oracles import episode_sequences
from .test_trainer_support import prompt_ids, text_ids, until_sql

Turn = tuple[list[int], list[int]]  # (whole prompt, output)


def episode(
    rng: random.Random,
    n_turns: int,
    *,
    rewrite_at: int | None = None,
    first: list[int] | None = None,
) -> list[Turn]:
    """Whole prompts (from `first`) that extend the previous prompt + output by an observation;
    at `rewrite_at` the history is rewritten (a prompt that does not extend it: a new segment)."""
    turns: list[Turn] = []
    prompt = first or [rng.randrange(1, 60) for _ in range(rng.randrange(3, 7))]
    for t in range(n_turns):
        if t == rewrite_at:
            prompt = [59, *prompt[2:]]  # a summarized history
        output = [rng.randrange(1, 60) for _ in range(rng.randrange(1, 5))]
        turns.append((prompt, output))
        prompt = prompt + output + [rng.randrange(1, 60) for _ in range(rng.randrange(1, 4))]
    return turns


def turn_events(
    run_id: str, episode_id: str, turns: list[Turn], *, linear: bool = True
) -> list[ev.TurnGenerated]:
    """TurnGenerated events as the emitters write them (`linear`), or as older STACX did (every
    prompt whole)."""
    out = []
    end: list[int] = []
    for t, (prompt, output) in enumerate(turns):
        prefix_len, new = ev.prompt_split(prompt, end) if linear else (0, prompt)
        out.append(
            ev.TurnGenerated(
                run_id=run_id,
                episode_id=episode_id,
                turn=t,
                prompt_ids=new,
                prefix_len=prefix_len,
                output_ids=output,
                logprobs=[-0.1 * (i + 1) for i in range(len(output))],
                weight_version=0,
            )
        )
        end = prompt + output
    return out


def test_turns_view_rebuilds_whole_prompts(log: Log) -> None:
    rng = random.Random(0)
    a, b = episode(rng, 6, rewrite_at=3), episode(rng, 4)
    log.write(*turn_events("r", "a", a), *turn_events("r", "b", b, linear=False))
    stored = log.rows(
        "select episode_id, turn, prefix_len, len(prompt_ids) AS n from turn_generated"
    )
    by_turn = {(r["episode_id"], r["turn"]): r for r in stored}
    # linear storage: turn 0 and the rewritten turn 3 whole, every other turn its new ids only
    assert [by_turn["a", t]["prefix_len"] > 0 for t in range(6)] == [
        False,
        True,
        True,
        False,
        True,
        True,
    ]
    assert sum(r["n"] for r in stored if r["episode_id"] == "a") < sum(len(p) for p, _ in a) / 2
    for eid, turns in (("a", a), ("b", b)):
        rows = log.rows(
            "select prompt_ids, n_prompt_tokens, output_ids from turns where episode_id = $e "
            "order by turn",
            {"e": eid},
        )
        assert [r["prompt_ids"] for r in rows] == [p for p, _ in turns]
        assert [r["n_prompt_tokens"] for r in rows] == [len(p) for p, _ in turns]
        assert [r["output_ids"] for r in rows] == [o for _, o in turns]
    # the training views read whole prompts too
    sft = log.rows("select prompt_ids from sft_examples where episode_id = 'a' order by turn")
    assert [r["prompt_ids"] for r in sft] == [p for p, _ in a]
    # and so does the pure rebuild that exports use
    events = turn_events("r", "a", a)
    assert ev.full_prompts(
        [(e.turn, e.prefix_len, e.prompt_ids, e.output_ids) for e in events]
    ) == [p for p, _ in a]


def test_turns_view_refuses_a_chain_with_a_turn_missing(log: Log) -> None:
    events = turn_events("r", "a", episode(random.Random(1), 3))
    log.write(events[0], events[2])
    assert log.rows("select count(*) AS n from turns")[0]["n"] == 2  # counts need no prompt
    with pytest.raises(duckdb.Error, match="turn 1 is missing"):
        log.rows("select prompt_ids from turns")
    with pytest.raises(ValueError, match="turn 2: prefix_len"):
        ev.full_prompts(
            [(e.turn, e.prefix_len, e.prompt_ids, e.output_ids) for e in (events[0], events[2])]
        )


def test_a_log_older_than_prefix_len_reads_whole_prompts(tmp_path: Path) -> None:
    turns = episode(random.Random(2), 3)
    con = db.open_writer(tmp_path / "run")
    Log(con).write(*turn_events("r", "a", turns, linear=False))
    con.execute("ALTER TABLE turn_generated DROP COLUMN prefix_len")  # as a log of last week
    con.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no view may be skipped for this log
        old = db.connect_run(tmp_path / "run")
    got = old.execute("select prompt_ids, prefix_len from turns order by turn").fetchall()
    assert got == [(p, 0) for p, _ in turns]


@pytest.fixture(scope="module")
def tiny() -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    config._attn_implementation = "sdpa"
    return Qwen3ForCausalLM(config).to(torch.float64)


def per_turn_samples(episodes: dict[str, list[Turn]]) -> tuple[list[Sample], list[str]]:
    samples, ids = [], []
    for eid, turns in episodes.items():
        adv = {"a": 1.0, "b": -0.5, "c": 0.25}[eid]
        for prompt, output in turns:
            lp = [-0.3 - 0.1 * i for i in range(len(output))]
            values = {"behavior_logprobs": lp, "advantages": [adv] * len(output)}
            samples.append(Sample(prompt, output, values))
            ids.append(eid)
    return samples, ids


def test_episode_sequence_gives_the_per_turn_logprobs_and_gradients(tiny: Qwen3ForCausalLM) -> None:
    rng = random.Random(3)
    episodes = {"a": episode(rng, 5), "b": episode(rng, 4, rewrite_at=2), "c": episode(rng, 1)}
    turns, ids = per_turn_samples(episodes)
    merged = episode_sequences(turns, ids)
    assert len(merged) == 4  # a, b's two segments, c
    assert sum(s.n_positions for s in merged) < sum(s.n_positions for s in turns)

    for loss in ("sft", "grpo"):
        assert_same_logprobs_and_gradients(tiny, merged, turns, loss)
    assert sum(len(o) for t in episodes.values() for _, o in t) == sum(
        len(s.completion_ids) for s in turns
    )


def forward_backward(
    model: nn.Module, samples: list[Sample], loss: str
) -> tuple[list[float], float, list[torch.Tensor]]:
    """The loss tokens' logprobs (in order), the loss and the gradients of one packed batch."""
    model.zero_grad()
    batch = pack(samples, row_tokens=256)
    lp = packed_token_logprobs(model, batch, boundaries="position_ids", chunk_tokens=16)
    mask = batch.loss_mask_R_T
    if loss == "sft":
        out = sft_loss(lp, mask)
    else:
        values = batch.values_R_T
        out = policy_gradient_loss(lp, values["behavior_logprobs"], values["advantages"], mask)
    out.loss.backward()
    flat = [float(x) for per in batch.per_sample(lp.detach()) for x in per]
    return flat, float(out.loss.detach()), [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]


def assert_same_logprobs_and_gradients(
    model: nn.Module, merged: list[Sample], turns: list[Sample], loss: str
) -> None:
    lp_turns, loss_turns, grads_turns = forward_backward(model, turns, loss)
    lp_seq, loss_seq, grads_seq = forward_backward(model, merged, loss)
    # the model's tokens only, in the same order: every output id of every turn
    assert len(lp_seq) == len(lp_turns) == sum(len(s.completion_ids) for s in turns)
    assert lp_seq == pytest.approx(lp_turns, abs=1e-10)
    assert loss_seq == pytest.approx(loss_turns, abs=1e-12)
    # fp64 model, but Qwen3's RMSNorm computes in fp32: equal up to fp32 rounding
    for g_seq, g_turn in zip(grads_seq, grads_turns, strict=True):
        assert float((g_seq - g_turn).norm()) <= 1e-6 * float(g_turn.norm()) + 1e-12
    assert any(float(g.abs().sum()) > 0 for g in grads_seq)


def test_a_completion_other_than_the_stored_output_ends_the_chain() -> None:
    """Within a chain a turn merges without comparing prompts only while the sequence is the
    chain's ids: a row whose completion is not the turn's stored output (a label in place of
    the executed action) leaves the chain, so the next turn starts a new sequence (it does not
    extend the label: the token-comparison oracle agrees)."""
    chains = {("e", 0): np.array([1, 2, 3, 4, 5, 6, 7, 8], np.int32)}  # turn_chains' ids
    keys, n_prompt = [("e", 0)] * 3, [2, 5, 7]  # turns 0, 1, 2 of the chain
    executed = [Sample([], [3]), Sample([], [6]), Sample([], [8])]
    labeled = [Sample([], [3]), Sample([], [9]), Sample([], [8])]  # turn 1: a label, not 6
    got = [contents(chain_sequences(s, keys, n_prompt, chains)) for s in (executed, labeled)]
    assert got[0] == [([1, 2], [3, 4, 5, 6, 7, 8], [1, 0, 0, 1, 0, 1], {})]
    assert got[1] == [
        ([1, 2], [3, 4, 5, 9], [1, 0, 0, 1], {}),
        ([1, 2, 3, 4, 5, 6, 7], [8], [1], {}),
    ]
    whole = [
        Sample(chains["e", 0][:n], s.completion_ids) for n, s in zip(n_prompt, labeled, strict=True)
    ]
    assert got[1] == contents(episode_sequences(whole, ["e"] * 3))


def grpo_group(log: Log, group: str = "g", *, n_turns: int = 4, seed: int = 4) -> list[str]:
    """A scored GRPO group of multi-turn episodes of one task (one first prompt), stored as each
    kind of log has them: e0 linearly, its turn 2 a teacher's (a turn the student rows leave
    out); e1 linearly, its history rewritten at turn 2 (a new chain: a new sequence); e2 as
    older STACX stored it, every prompt whole. Returns the episode ids."""
    rng = random.Random(seed)
    first = [rng.randrange(1, 60) for _ in range(8)]
    shapes = [(None, True), (2, True), (None, False)]  # (rewrite_at, linear)
    log.write(
        ev.TaskScheduled(
            run_id="r", task_id="t", task_path="/x", group_id=group, n_samples=len(shapes)
        )
    )
    ids = []
    for i, ((rewrite_at, linear), reward) in enumerate(zip(shapes, [1.0, 0.0, 0.5], strict=True)):
        eid = f"{group}-e{i}"
        turns = episode(rng, n_turns, rewrite_at=rewrite_at, first=first)
        events = turn_events("r", eid, turns, linear=linear)
        if i == 0:
            events[2] = msgspec.structs.replace(events[2], actor=ev.TurnActor.TEACHER)
        log.write(
            ev.EpisodeStarted(
                run_id="r", episode_id=eid, task_id="t", group_id=group, sample_index=i
            ),
            *events,
            ev.EpisodeFinished(
                run_id="r", episode_id=eid, stop_reason="submitted", n_turns=n_turns
            ),
            ev.RewardAssigned(run_id="r", episode_id=eid, reward=reward),
        )
        ids.append(eid)
    return ids


def query_of(log: Log, read: list[pa.Table] | None = None) -> Query:
    """The trainer's ``query`` over the test's log; ``read`` collects every table returned."""

    async def query(sql: str, params: dict[str, object]) -> pa.Table:
        table = log.con.sql(sql, params=params).to_arrow_table()
        if read is not None:
            read.append(table)
        return table

    return query


def contents(samples: list[Sample]) -> list[tuple[object, ...]]:
    return [
        (
            list(s.prompt_ids),
            list(s.completion_ids),
            [] if s.loss_mask is None else list(s.loss_mask),
            {k: list(v) for k, v in s.token_values.items()},
        )
        for s in samples
    ]


def whole_config(cfg: TrainerConfig) -> TrainerConfig:
    """The per-turn read: every row with its whole prompt (the view's), no packing."""
    return msgspec.structs.replace(cfg, pack_episodes=False)


@pytest.mark.parametrize("share", [False, True])
async def test_trainer_step_on_episode_sequences_equals_the_per_turn_step(
    log: Log, tiny: Qwen3ForCausalLM, share: bool
) -> None:
    """The trainer's batch read (`step_batch`: rows without prompts, each episode rebuilt from
    the stored deltas) and its step give the per-turn samples' loss, gradients and update.
    `share`: the group's episodes start with one prompt, forwarded once (`pack_shared`)."""
    eids = grpo_group(log)
    cfg = TrainerConfig(
        algorithm="grpo", optimizer="sgd", lr=0.5, max_tokens=64, share_prompts=False
    )
    per_turn_batch = await step_batch(whole_config(cfg), query_of(log), eids)
    packed_batch = await step_batch(cfg, query_of(log), eids)
    rows, episodes = per_turn_batch.samples, packed_batch.samples
    n_rows, n_packed_rows = per_turn_batch.n_rows, packed_batch.n_rows
    # 12 turns less e0's teacher turn; e0 (across its teacher turn), e1's two chains, and e2's
    # four (a log that stored every prompt whole: a chain per turn, never merged by its tokens)
    assert (len(rows), n_rows, n_packed_rows, len(episodes)) == (11, 11, 11, 7)
    for loss in ("sft", "grpo"):
        assert_same_logprobs_and_gradients(tiny, episodes, rows, loss)
    results, params = [], []
    for samples, shared in ((rows, False), (episodes, share)):
        model = copy.deepcopy(tiny)
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
        step_cfg = msgspec.structs.replace(cfg, share_prompts=shared)
        results.append(train_step(step_cfg, model, opt, samples, 1))
        params.append([p.detach() for p in model.parameters()])
    per_turn, packed = results
    assert packed.loss == pytest.approx(per_turn.loss, abs=1e-12)
    assert packed.n_loss_tokens == per_turn.n_loss_tokens
    assert packed.grad_norm == pytest.approx(per_turn.grad_norm, rel=1e-6)  # fp32 RMSNorm
    assert packed.n_tokens < per_turn.n_tokens  # the forward: each chain once
    whole = sum(e.n_positions for e in episodes)
    assert packed.n_tokens < whole if share else packed.n_tokens == whole  # and the prompt once
    for a, b in zip(*params, strict=True):
        torch.testing.assert_close(a, b, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("algorithm", ["grpo", "sft"])
async def test_the_batch_read_rebuilds_the_sequences_from_the_stored_ids_only(
    log: Log, algorithm: str
) -> None:
    """The linear read gives exactly the sequences the token-comparison oracle merges the
    view's whole-prompt rows into, per chain (ids, loss mask, behavior logprobs, advantages),
    while the prompt ids it reads are the stored ones: never a whole prompt per turn (sft: the
    filter leaves the teacher's turn out)."""
    eids = grpo_group(log)
    cfg = TrainerConfig(algorithm=algorithm, filter="actor = 'student'" * (algorithm == "sft"))
    per_row = await step_batch(whole_config(cfg), query_of(log), eids)
    rows = log.con.sql(
        units.batch_rows_sql(cfg, "prompt_ids"), params={"episode_ids": sorted(eids)}
    ).to_arrow_table()
    assert [list(s.prompt_ids) for s in per_row.samples] == rows.column("prompt_ids").to_pylist()
    chains = zip(
        per_row.table.column("episode_id").to_pylist(),
        per_row.table.column("chain_turn").to_pylist(),
        strict=True,
    )
    expected = episode_sequences(per_row.samples, list(chains))
    read: list[pa.Table] = []
    batch = await step_batch(cfg, query_of(log, read), eids)
    got = batch.samples
    assert contents(got) == contents(expected) and len(got) == 7

    def n_ids(sql: str) -> int:
        return int(log.rows(sql)[0]["n"])

    # the chains hold each stored id once: every turn's stored prompt ids and output ids
    stored = n_ids("select sum(len(prompt_ids) + len(output_ids)) AS n from turn_generated")
    whole = n_ids("select sum(len(prompt_ids)) AS n from turns where actor = 'student'")
    assert all("prompt_ids" not in t.column_names for t in read if t.num_rows)  # no whole prompt
    chain_ids = sum(
        sum(len(p) for p in t.column("ids").to_pylist()) for t in read if "ids" in t.column_names
    )
    assert chain_ids == batch.prompt_ids_read == stored < whole  # (e2: every prompt whole)
    assert per_row.prompt_ids_read == stored  # one sample per row: its prompt cut from the chain


async def test_an_old_log_trains_a_sequence_per_turn(tmp_path: Path) -> None:
    """A log older than ``prefix_len`` (the recorder re-adds the column: NULL on every row, each
    prompt whole): every turn starts a chain, so each trains as its own sequence, the per-turn
    samples (never merged by comparing tokens: the same gradients, a longer forward)."""
    con = db.open_writer(tmp_path / "run")
    log = Log(con)
    rng = random.Random(6)
    for eid in ("a", "b"):
        log.write(*turn_events("r", eid, episode(rng, 4), linear=False))
    con.execute("ALTER TABLE turn_generated DROP COLUMN prefix_len")  # as a log of last week
    con.close()
    log = Log(db.open_writer(tmp_path / "run"))
    assert log.rows("select count(*) AS n from turn_generated where prefix_len is null") == [
        {"n": 8}
    ]
    cfg = TrainerConfig(algorithm="sft", filter="turn >= 0")
    rows = (await step_batch(whole_config(cfg), query_of(log), ["a", "b"])).samples
    got = (await step_batch(cfg, query_of(log), ["a", "b"])).samples
    whole = log.rows("select prompt_ids from turns order by episode_id, turn")
    assert [list(s.prompt_ids) for s in rows] == [r["prompt_ids"] for r in whole]
    assert contents(got) == contents(rows) and len(got) == 8
    log.con.close()


async def test_the_batch_read_refuses_a_chain_it_cannot_rebuild(log: Log) -> None:
    """A turn stored after a missing turn, or with a prefix_len that is not its predecessor's
    prompt + output length, is an error naming it: never merged on a guess."""
    rng = random.Random(7)
    a = turn_events("r", "a", episode(rng, 3))
    b = turn_events("r", "b", episode(rng, 3))
    b[1] = msgspec.structs.replace(b[1], prefix_len=b[1].prefix_len - 1)
    log.write(a[0], a[2], *b)
    cfg = TrainerConfig(algorithm="sft", filter="turn >= 0")
    # the view's error (turn_links: the one place a prompt is rebuilt), raised by the query
    with pytest.raises(duckdb.Error, match=r"episode a turn 2 has prefix_len .* turn 1 is missing"):
        await step_batch(cfg, query_of(log), ["a"])
    with pytest.raises(duckdb.Error, match="episode b turn 1 has prefix_len"):
        await step_batch(cfg, query_of(log), ["b"])


async def test_a_view_without_chain_columns_is_refused_naming_them(log: Log) -> None:
    """Every training view says where its rows' prompts are (``chain_turn``,
    ``n_prompt_tokens``): a source view without them is an error naming the view and the
    columns, never a second way to rebuild prompts."""
    eids = grpo_group(log)
    log.con.execute(
        "CREATE VIEW my_sft AS SELECT * EXCLUDE (chain_turn, n_prompt_tokens) FROM sft_examples"
    )
    cfg = TrainerConfig(algorithm="sft", filter="actor = 'student'", source="my_sft")
    with pytest.raises(
        BatchError, match=r"trainer.source = 'my_sft'.*'chain_turn', 'n_prompt_tokens'"
    ):
        await step_batch(cfg, query_of(log), eids)


@pytest.fixture(scope="module")
def base() -> nn.Module:
    return load_model("default", torch.device("cpu"), torch.float32)


async def test_trainer_actor_trains_each_episode_as_one_sequence(
    tmp_path: Path, base: nn.Module
) -> None:
    """The Trainer actor (real NATS, real DuckDB, the default model) on a group of 3-turn
    episodes: one sequence per episode, the positions of each episode's length once."""
    first = prompt_ids("Count to three, one number per turn.")
    async with RunContext(tmp_path / "run") as run:
        cfg = TrainerConfig(
            steps=1,
            batch_groups=1,
            trainable=r"^model\.norm\.weight$",
            keep_last=0,
            share_prompts=False,
        )
        run.spawn(Trainer(cfg, model=copy.deepcopy(base)))
        await run.emit(
            ev.TaskScheduled(
                run_id=run.run_id, task_id="t", task_path="/x", group_id="g", n_samples=2
            )
        )
        whole_lengths = []
        for i, reward in enumerate([1.0, 0.0]):
            eid = f"g-e{i}"
            turns: list[Turn] = []
            prompt = first
            for t in range(3):
                output = text_ids(f"{t + i}<|im_end|>")
                turns.append((prompt, output))
                prompt = (
                    prompt
                    + output
                    + text_ids(f"\n<|im_start|>user\nnext {t}<|im_end|>\n<|im_start|>assistant\n")
                )
            whole_lengths.append(len(turns[-1][0]) + len(turns[-1][1]) - 1)
            await run.emit(
                ev.EpisodeStarted(
                    run_id=run.run_id, episode_id=eid, task_id="t", group_id="g", sample_index=i
                )
            )
            for e in turn_events(run.run_id, eid, turns):
                await run.emit(e)
            await run.emit(
                ev.EpisodeFinished(run_id=run.run_id, episode_id=eid, stop_reason="submitted")
            )
            await run.emit(ev.RewardAssigned(run_id=run.run_id, episode_id=eid, reward=reward))
        await until_sql(run, "select max(version) from weights", 1)
        (step,) = (await run.query("select * from train_step_finished")).to_pylist()
    assert step["n_samples"] == 6 and json.loads(step["metrics_json"])["n_sequences"] == 2
    assert step["n_tokens"] == sum(whole_lengths)

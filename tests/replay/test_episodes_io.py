"""Selecting, exporting and re-importing episodes; export -> replay equals run dir -> replay."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from stacx import events as ev
from stacx.actors.run import RunContext
from stacx.errors import StacxError
from stacx.store import db
from stacx.store.episodes_io import (
    export_row,
    read_export,
    read_records,
    reimport,
    whole_turns,
    write_export,
)
from tests.backbone.factory import episode_events


@pytest.fixture
async def source(tmp_path: Path) -> Path:
    async with RunContext(tmp_path / "src", recipe="src") as run:
        for e in episode_events(run.run_id, 8, tokens=6, turns=2):
            await run.emit(e)
    return tmp_path / "src"


def _strip(events: list[ev.Event]) -> list[tuple[str, dict[str, object]]]:
    import msgspec

    return [(e.kind, msgspec.to_builtins(e)) for e in events]


async def test_where_selects_episodes_and_all_their_events(source: Path) -> None:
    con = db.connect_run(source)
    winners = {
        r[0] for r in con.execute("select episode_id from episodes where reward > 0").fetchall()
    }
    recs = read_records(source, "reward > 0")
    assert {r.episode_id for r in recs} == winners and winners
    kinds = [e["kind"] for e in recs[0].events]
    assert (
        kinds[0] == "EpisodeStarted"
        and kinds.count("TurnGenerated") == 2
        and "RewardAssigned" in kinds
    )
    with pytest.raises(StacxError, match="not a valid predicate"):
        read_records(source, "nonsense >")


async def test_export_row_has_tokens_mask_and_reward(source: Path) -> None:
    rec = read_records(source)[0]
    row = export_row(rec)
    turns = whole_turns([e for e in rec.events if e["kind"] == "TurnGenerated"])
    assert row["contiguous"] is True
    ids, mask = row["input_ids"], row["loss_mask"]
    assert ids == list(turns[-1]["prompt_ids"]) + list(turns[-1]["output_ids"])
    assert sum(mask) == sum(len(t["output_ids"]) for t in turns)
    assert row["reward"] == rec.reward


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
async def test_replay_from_export_equals_replay_from_run_dir(
    source: Path, tmp_path: Path, fmt: str
) -> None:
    from_dir = read_records(source, "reward > 0")
    path = tmp_path / f"out.{fmt}"
    write_export([export_row(r) for r in read_records(source)], path, fmt)
    from_file = read_export(path, "reward > 0")
    assert _strip(list(reimport(from_file, "dst"))) == _strip(list(reimport(from_dir, "dst")))
    if fmt == "jsonl":  # usable by other trainers: plain JSON lines with token ids and masks
        first = json.loads(path.read_text().splitlines()[0])
        assert {"input_ids", "loss_mask", "reward", "messages"} <= set(first)


async def test_reimport_into_a_run_keeps_provenance_and_is_idempotent(
    source: Path, tmp_path: Path
) -> None:
    recs = read_records(source, "reward > 0")
    n_events = sum(len(r.events) for r in recs)
    for _ in range(2):  # importing twice changes nothing: derived ids are de-duplicated
        async with RunContext(tmp_path / "dst", recipe="dst") as run:
            for e in reimport(recs, run.run_id):
                await run.emit(e)
    con = duckdb.connect(str(db.db_path(tmp_path / "dst")), read_only=True)
    assert con.execute("select count(*) from event_imported").fetchone() == (n_events,)
    src_run = recs[0].run_id
    assert con.execute(
        "select count(distinct source_run_id), min(source_run_id) from event_imported"
    ).fetchone() == (1, src_run)
    assert con.execute("select count(*) from episodes where reward > 0").fetchone() == (len(recs),)


async def test_replayed_sft_batch_equals_the_source_batch(source: Path, tmp_path: Path) -> None:
    recs = read_records(source, "reward > 0")
    async with RunContext(tmp_path / "dst", recipe="dst") as run:
        for e in reimport(recs, run.run_id):
            await run.emit(e)
    q = (
        "select episode_id, turn, prompt_ids, completion_ids, loss_mask from sft_examples "
        "where reward > 0 order by episode_id, turn"
    )
    direct = db.connect_run(source).execute(q).fetchall()
    replayed = db.connect_run(tmp_path / "dst").execute(q).fetchall()
    assert direct and replayed == direct


async def _train_step(run: RunContext, step: int, episode_ids: list[str]) -> None:
    await run.emit(
        ev.TrainStepFinished(
            run_id=run.run_id,
            step=step,
            algorithm="sft",
            loss=1.0,
            weight_version=step,
            episode_ids=episode_ids,
        )
    )
    await run.emit(
        ev.WeightsPublished(run_id=run.run_id, version=step, path=f"/ckpt/v{step}", sha256="0")
    )


async def test_lineage_over_a_two_generation_chain(source: Path, tmp_path: Path) -> None:
    a_recs = read_records(source, "reward > 0")
    a_run = a_recs[0].run_id
    a_ids = sorted(r.episode_id for r in a_recs)
    async with RunContext(
        tmp_path / "B", recipe="B"
    ) as run:  # B: replay of A, plus its own episode
        for e in reimport(a_recs, run.run_id):
            await run.emit(e)
        await run.emit(
            ev.EpisodeStarted(run_id=run.run_id, episode_id="b-own", task_id="t", group_id="gb")
        )
        await run.emit(ev.RewardAssigned(run_id=run.run_id, episode_id="b-own", reward=1.0))
        await _train_step(run, 1, [*a_ids, "b-own"])
        b_run = run.run_id
    b_recs = read_records(tmp_path / "B", "reward > 0")
    async with RunContext(tmp_path / "C", recipe="C") as run:  # C: replay of B
        for e in reimport(b_recs, run.run_id):
            await run.emit(e)
        await _train_step(run, 1, sorted(r.episode_id for r in b_recs))
    con = db.connect_run(tmp_path / "C")
    rows = con.execute(
        "select episode_id, source_run_id, origin_run_id, imported from lineage "
        "where weight_version = 1 order by episode_id"
    ).fetchall()
    assert {r[0] for r in rows} == {*a_ids, "b-own"}
    for episode_id, src, origin, imported in rows:
        assert imported and src == b_run
        assert origin == (b_run if episode_id == "b-own" else a_run)
    # and the other direction: which checkpoints did one of A's episodes influence, across runs?
    both = db.attach_runs([tmp_path / "B", tmp_path / "C"])
    influenced = both.execute(
        "select run_id, weight_version from lineage where episode_id = ? order by 1", [a_ids[0]]
    ).fetchall()
    assert influenced == sorted([(b_run, 1), (run.run_id, 1)])

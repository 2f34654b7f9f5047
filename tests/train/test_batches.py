"""From views to tensors: read_batch over a real DuckDB run log."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import duckdb
import pytest
import torch

from stacx.events import (
    EpisodeStarted,
    RewardAssigned,
    TeacherLabeled,
    TeacherScored,
    TrainStepFinished,
    TurnGenerated,
)
from stacx.store.db import attach_runs, connect_run, open_writer
from stacx.train.columns import BatchError, samples_from_table
from stacx.train.packing import PackedBatch, pack

from .conftest import Log

RUN = "run-b"


def read_batch(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    params: Sequence[object] | None = None,
    *,
    row_tokens: int,
    one_per_row: bool = False,
    pad_to: int = 1,
    prompt: str = "prompt_ids",
    completion: str = "completion_ids",
    token_columns: Mapping[str, str] | None = None,
    scalar_columns: Mapping[str, str] | None = None,
    loss_mask: str | None = None,
) -> PackedBatch:
    """Run ``sql`` and pack its rows (``one_per_row``: padded); BatchError on an empty result."""
    table = con.sql(sql, params=list(params) if params else None).to_arrow_table()
    if table.num_rows == 0:
        raise BatchError(f"query returned no rows: {sql}")
    samples = samples_from_table(
        table,
        prompt=prompt,
        completion=completion,
        token_columns=token_columns,
        scalar_columns=scalar_columns,
        loss_mask=loss_mask,
    )
    return pack(samples, row_tokens, one_per_row=one_per_row, pad_to=pad_to)


def grpo_log(log: Log) -> None:
    """Group g: e0 (reward 1, one turn of 3 ids), e1 (reward 0, one turn of 2 ids)."""
    for eid, reward, out in (("e0", 1.0, [5, 6, 7]), ("e1", 0.0, [8, 9])):
        log.write(
            EpisodeStarted(run_id=RUN, episode_id=eid, task_id="t", group_id="g"),
            TurnGenerated(
                run_id=RUN,
                episode_id=eid,
                turn=0,
                prompt_ids=[1, 2],
                output_ids=out,
                logprobs=[-0.1 * (i + 1) for i in range(len(out))],
                weight_version=0,
            ),
            RewardAssigned(run_id=RUN, episode_id=eid, reward=reward),
        )


def test_grpo_batch_becomes_a_packed_batch_with_advantages_on_completion_tokens(log: Log) -> None:
    grpo_log(log)
    batch = read_batch(
        log.con,
        "select * from grpo_batch order by episode_id",
        row_tokens=16,
        completion="output_ids",
        token_columns={"behavior_logprobs": "behavior_logprobs"},
        scalar_columns={"advantages": "advantage"},
    )
    assert batch.input_ids_R_T.shape[0] == 1  # both sequences share one row
    assert batch.n_samples == 2 and batch.n_loss_tokens == 5
    adv = batch.per_sample(batch.values_R_T["advantages"])
    assert adv[0].tolist() == [0.5, 0.5, 0.5] and adv[1].tolist() == [-0.5, -0.5]
    behavior = batch.per_sample(batch.values_R_T["behavior_logprobs"])
    assert behavior[0].tolist() == pytest.approx([-0.1, -0.2, -0.3])
    assert batch.per_sample(batch.targets_R_T)[1].tolist() == [8, 9]


def test_sft_examples_loss_mask_and_padded_layout(log: Log) -> None:
    grpo_log(log)
    batch = read_batch(
        log.con,
        "select * from sft_examples where reward > 0",
        row_tokens=16,
        one_per_row=True,
        loss_mask="loss_mask",
    )
    assert batch.input_ids_R_T.tolist() == [[1, 2, 5, 6]]
    assert batch.targets_R_T.tolist() == [[2, 5, 6, 7]]
    assert batch.loss_mask_R_T.tolist() == [[False, True, True, True]]


def test_opd_batch_per_token_advantages(log: Log) -> None:
    grpo_log(log)
    log.write(TeacherScored(run_id=RUN, episode_id="e1", turn=0, teacher_logprobs=[-1.0, 0.0]))
    batch = read_batch(
        log.con,
        "select * from opd_batch where aligned",
        row_tokens=8,
        completion="output_ids",
        token_columns={"advantages": "advantages", "behavior_logprobs": "student_logprobs"},
    )
    assert batch.per_sample(batch.values_R_T["advantages"])[0].tolist() == pytest.approx(
        [-0.9, 0.2]
    )


def test_null_or_misaligned_values_name_the_column_and_episode(log: Log) -> None:
    grpo_log(log)
    log.write(TeacherLabeled(run_id=RUN, episode_id="e0", turn=0, prompt_ids=[1, 2], label_ids=[4]))
    with pytest.raises(
        BatchError,
        match=r"episode_id=e0, turn=0: column 'teacher_logprobs' needs 1 floats.*got NULL",
    ):
        read_batch(
            log.con,
            "select * from dagger_dataset",
            row_tokens=8,
            token_columns={"t": "teacher_logprobs"},
        )
    with pytest.raises(BatchError, match=r"columns \['nope'\] not in the result"):
        read_batch(log.con, "select * from grpo_batch", row_tokens=8, completion="nope")
    with pytest.raises(BatchError, match="no rows"):
        read_batch(
            log.con, "select * from grpo_batch where false", row_tokens=8, completion="output_ids"
        )
    table = log.con.sql("select * from sft_examples").to_arrow_table()
    # a mask over prompt || completion (the layout of older views) is refused, not sliced
    with pytest.raises(BatchError, match=r"'loss_mask' needs \d+ 0/1 entries .* got \d+ values"):
        lengths = [
            len(p) + len(c)
            for p, c in zip(
                table.column("prompt_ids").to_pylist(),
                table.column("completion_ids").to_pylist(),
                strict=True,
            )
        ]
        bad = table.set_column(
            table.column_names.index("loss_mask"), "loss_mask", [[[0] * n for n in lengths]]
        )
        samples_from_table(bad, loss_mask="loss_mask")


def test_views_work_read_only_and_across_attached_runs(tmp_path: Path) -> None:
    """`stacx sql` paths: a closed run opened read-only, and two runs attached together — the
    DAgger dataset is then the union of both runs' labels."""
    runs = []
    for k in range(2):
        run_dir = tmp_path / f"r{k}"
        con = open_writer(run_dir)
        log = Log(con)
        log.write(
            EpisodeStarted(run_id=f"r{k}", episode_id=f"s{k}", task_id="t", group_id=f"g{k}"),
            TurnGenerated(
                run_id=f"r{k}", episode_id=f"s{k}", turn=0, prompt_ids=[1], output_ids=[2]
            ),
            TeacherLabeled(
                run_id=f"r{k}",
                episode_id=f"s{k}",
                turn=0,
                prompt_ids=[1],
                label_ids=[3],
                iteration=k,
            ),
            TrainStepFinished(
                run_id=f"r{k}",
                step=1,
                algorithm="dagger",
                loss=1.0,
                weight_version=1,
                episode_ids=[f"s{k}"],
            ),
        )
        con.close()
        runs.append(run_dir)
    ro = connect_run(runs[0])
    assert ro.execute("select count(*) from dagger_dataset").fetchall() == [(1,)]
    ro.close()
    both = attach_runs(runs)
    assert both.execute(
        "select count(*), count(distinct run_id) from dagger_dataset"
    ).fetchall() == [(2, 2)]
    assert both.execute("select count(*) from lineage").fetchall() == [(2,)]
    batch = read_batch(both, "select * from dagger_dataset", row_tokens=4, loss_mask="loss_mask")
    assert torch.equal(batch.targets_R_T[batch.loss_mask_R_T], torch.tensor([3, 3]))
    both.close()

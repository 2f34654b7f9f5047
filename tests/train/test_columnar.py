"""The columnar batch path gives exactly the tensors of the list path it replaced: a recorded
multi-turn GRPO group (a linear log with a teacher turn left out, a rewritten history, an old
log with every prompt whole), read by the trainer's `step_batch` and packed by `pack`, against
the path of STACX 6e3d883 kept here as the oracle: the view's rows with their whole prompts to
Python lists (``to_pylist``), the turns of one chain merged by comparing whole prompts as
lists, one ``torch.tensor`` per sample."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch

from stacx.train import units
from stacx.train.config import TrainerConfig
from stacx.train.packing import PackedBatch, assign_rows, pack
from stacx.train.trainer import step_batch

from .conftest import Log
from .test_episode_packing import grpo_group, query_of

Row = tuple[list[int], list[int], dict[str, list[float]], list[int]]  # prompt, completion, ...


def list_rows(cfg: TrainerConfig, table: pa.Table) -> tuple[list[Row], list[object]]:
    """The rows as the list path read them: every column through to_pylist."""
    cols = table.to_pydict()
    rows: list[Row] = []
    for i in range(table.num_rows):
        if cfg.algorithm == "grpo":
            out = cols["output_ids"][i]
            adv = cols["advantage_std" if cfg.normalize_std else "advantage"][i]
            values = {
                "behavior_logprobs": cols["behavior_logprobs"][i],
                "advantages": [float(adv)] * len(out),
            }
            rows.append((cols["prompt_ids"][i], out, values, [1] * len(out)))
        else:
            out = cols["completion_ids"][i]
            rows.append((cols["prompt_ids"][i], out, {}, cols["loss_mask"][i]))
    return rows, list(zip(cols["episode_id"], cols["chain_turn"], strict=True))


def list_merge(rows: list[Row], episodes: list[object]) -> list[Row]:
    """The list path's merge: a row of the sequence's chain whose whole prompt extends it joins
    it (`episodes`: each row's (episode, chain_turn))."""
    out: list[Row] = []
    seq: list[int] = []
    n_prompt, current = 0, None
    mask: list[int] = []
    values: dict[str, list[float]] = {}
    for (prompt, completion, vals, m), episode in zip(rows, episodes, strict=True):
        if seq and episode == current and len(prompt) >= len(seq) and prompt[: len(seq)] == seq:
            gap = prompt[len(seq) :]
            seq, mask = seq + gap, mask + [0] * len(gap)
            values = {k: v + [0.0] * len(gap) for k, v in values.items()}
        else:
            if seq:
                out.append((seq[:n_prompt], seq[n_prompt:], values, mask))
            seq, n_prompt, current, mask = list(prompt), len(prompt), episode, []
            values = {k: [] for k in vals}
        seq, mask = seq + completion, mask + m
        values = {k: v + vals[k] for k, v in values.items()}
    out.append((seq[:n_prompt], seq[n_prompt:], values, mask))
    return out


def list_pack(rows: list[Row], row_tokens: int) -> PackedBatch:
    """The list path's pack: one torch.tensor per sample and field."""
    lengths = [len(p) + len(c) - 1 for p, c, _, _ in rows]
    placed = assign_rows(lengths, row_tokens)
    t = max(sum(lengths[i] for i in r) for r in placed)
    names = sorted(rows[0][2])
    ids_t, tgt, pos = (torch.zeros(len(placed), t, dtype=torch.long) for _ in range(3))
    seq_index = torch.full((len(placed), t), -1, dtype=torch.long)
    mask_t = torch.zeros(len(placed), t, dtype=torch.bool)
    vals = {k: torch.zeros(len(placed), t) for k in names}
    seqlens: list[int] = []
    for r, members in enumerate(placed):
        offset = 0
        for i in members:
            prompt, completion, v, m = rows[i]
            ids = torch.tensor([*prompt, *completion], dtype=torch.long)
            n = lengths[i]
            ids_t[r, offset : offset + n], tgt[r, offset : offset + n] = ids[:-1], ids[1:]
            pos[r, offset : offset + n] = torch.arange(n)
            seq_index[r, offset : offset + n] = i
            span = slice(offset + len(prompt) - 1, offset + len(prompt) - 1 + len(completion))
            mask_t[r, span] = torch.tensor(m, dtype=torch.bool)
            for k in names:
                vals[k][r, span] = torch.tensor(v[k], dtype=torch.float32)
            seqlens.append(n)
            offset += n
        if offset < t:
            pos[r, offset:] = torch.arange(t - offset)
            seqlens.append(t - offset)
    cu = torch.zeros(len(seqlens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(seqlens, dtype=torch.int32).cumsum(0)
    return PackedBatch(ids_t, pos, tgt, mask_t, seq_index, vals, cu, max(seqlens), len(rows))


@pytest.mark.parametrize("algorithm", ["grpo", "sft"])
@pytest.mark.parametrize("pack_episodes", [True, False])
async def test_the_columnar_path_gives_the_list_paths_tensors(
    log: Log, algorithm: str, pack_episodes: bool
) -> None:
    eids = grpo_group(log, n_turns=5) + grpo_group(log, "h", n_turns=3, seed=9)
    cfg = TrainerConfig(algorithm=algorithm, pack_episodes=pack_episodes)
    whole = log.con.sql(units.batch_rows_sql(cfg), params={"episode_ids": sorted(eids)})
    rows, episodes = list_rows(cfg, whole.to_arrow_table())
    expected = list_pack(list_merge(rows, episodes) if pack_episodes else rows, 64)
    got = pack((await step_batch(cfg, query_of(log), eids)).samples, 64)
    assert got.n_samples == expected.n_samples
    if algorithm == "grpo":  # 6 episodes, 14 sequences: e0 and h-e0 one each, e1 and h-e1 two
        # (they rewrite their history), e2 and h-e2 one per turn (every prompt stored whole)
        assert got.n_samples == (14 if pack_episodes else len(rows))
    for field in (
        "input_ids_R_T",
        "position_ids_R_T",
        "targets_R_T",
        "loss_mask_R_T",
        "sequence_index_R_T",
        "cu_seqlens",
    ):
        a, b = getattr(got, field), getattr(expected, field)
        assert a.dtype == b.dtype and torch.equal(a, b), field
    assert got.max_seqlen == expected.max_seqlen
    # GRPO rows also carry each token's weight version (per-token staleness, stacx.train.batches)
    extra = {"weight_version"} if algorithm == "grpo" else set()
    assert sorted(set(got.values_R_T) - extra) == sorted(expected.values_R_T)
    assert extra <= set(got.values_R_T)
    for name, v in expected.values_R_T.items():
        assert got.values_R_T[name].dtype == torch.float32, name
        assert torch.equal(got.values_R_T[name], v), name

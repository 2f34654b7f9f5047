"""A prefill as flat tokens: several rows' new tokens laid out as one batch in pieces of a token
budget, with the attention tiles that `triton_attention.prefill_attention` reads (the Triton
step's prefill, `Decoder.prefill`, and its CUDA graphs, `GraphedDecode.prefill_piece`).
Design: docs/engine.md#the-kernels
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import torch


class FlatPiece(NamedTuple):
    """Prefill tokens of several rows as one batch: token t is ``ids[t]`` of row ``rows[t]`` at
    ``pos[t]``; ``tiles`` [J, 3]: (row, first token, count) runs of one row's consecutive
    tokens; ``keys``: max(pos) + 1; ``picks``: (row index, token index) of each token."""

    ids: torch.Tensor
    pos: torch.Tensor
    rows: torch.Tensor
    tiles: torch.Tensor
    keys: int
    picks: list[tuple[int, int]]


def flat_pieces(
    slots: list[int],
    offsets: list[int],
    new_ids: list[list[int]],
    budget: int,
    tile: int,
    device: torch.device,
) -> Iterator[FlatPiece]:
    """Row ``slots[r]``'s tokens ``new_ids[r]`` from position ``offsets[r]``, in pieces of at most
    `budget` tokens (a row may span pieces: a later piece reads the earlier one's keys)."""
    ids: list[int] = []
    pos: list[int] = []
    rows: list[int] = []
    tiles: list[tuple[int, int, int]] = []
    picks: list[tuple[int, int]] = []

    def piece() -> FlatPiece:
        def dev(x: list[Any], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(x, dtype=dtype).to(device, non_blocking=True)

        return FlatPiece(
            dev(ids, torch.long),
            dev(pos, torch.long),
            dev(rows, torch.long),
            dev(tiles, torch.int32),
            max(pos) + 1,
            list(picks),
        )

    for r, (slot, off, row_ids) in enumerate(zip(slots, offsets, new_ids, strict=True)):
        i = 0
        while i < len(row_ids):
            if len(ids) == budget:
                yield piece()
                for acc in (ids, pos, rows, tiles, picks):
                    acc.clear()
            take = min(len(row_ids) - i, budget - len(ids))
            first = len(ids)
            ids += row_ids[i : i + take]
            pos += range(off + i, off + i + take)
            rows += [slot] * take
            picks += [(r, i + k) for k in range(take)]
            tiles += [(slot, first + s, min(tile, take - s)) for s in range(0, take, tile)]
            i += take
    if ids:
        yield piece()

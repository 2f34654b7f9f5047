"""Sequence packing: variable-length (prompt + completion) sequences laid whole, one after another,
in few dense rows (first-fit decreasing), with ``cu_seqlens`` for varlen kernels and a block-causal
mask for the others; ``pack_shared`` keeps one copy of a group's prompt. Guarantees: targets never
cross a sequence boundary; padding is its own segment with no loss; a sequence longer than a row is
an error, never truncated.
Design: docs/training.md#sequence-packing
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from stacx.errors import StacxError


class PackingError(StacxError):
    """A sample cannot be packed (too long, inconsistent per-token arrays)."""


Ints = Sequence[int] | NDArray[Any]
Floats = Sequence[float] | NDArray[Any]


@dataclass(frozen=True)
class Sample:
    """One training sequence: ``prompt_ids`` then ``completion_ids``; ``loss_mask`` (default all 1)
    and each ``token_values`` entry hold one value per completion id. Lists or numpy arrays."""

    prompt_ids: Ints
    completion_ids: Ints
    token_values: Mapping[str, Floats] = field(default_factory=dict)
    loss_mask: Ints | None = None

    @property
    def n_positions(self) -> int:
        """Positions this sample occupies in a packed row (one fewer than its ids)."""
        return len(self.prompt_ids) + len(self.completion_ids) - 1


@dataclass(frozen=True)
class PackedBatch:
    """Rows of packed samples; every ``*_R_T`` tensor is ``[rows, row_length]``."""

    input_ids_R_T: Tensor
    position_ids_R_T: Tensor
    targets_R_T: Tensor
    loss_mask_R_T: Tensor  # bool
    sequence_index_R_T: Tensor  # which sample each position belongs to; -1 for padding
    values_R_T: dict[str, Tensor]  # float32, 0 outside completion positions
    cu_seqlens: Tensor  # int32 [n_segments + 1], over the row-major flattened batch
    max_seqlen: int
    n_samples: int
    # Shared prompts (`pack_shared`): each position's segment, and the segment it may also
    # attend to (its group's shared prompt; -1 for none). None for plain packing.
    segment_R_T: Tensor | None = None
    parent_R_T: Tensor | None = None

    @property
    def shares_prompts(self) -> bool:
        return self.parent_R_T is not None

    @property
    def n_tokens(self) -> int:
        """Real (non-padding) positions."""
        return int((self.sequence_index_R_T >= 0).sum())

    @property
    def n_loss_tokens(self) -> int:
        return int(self.loss_mask_R_T.sum())

    def to(self, device: torch.device | str) -> PackedBatch:
        """Every tensor (and each of ``values_R_T``) on `device`."""

        def move(value: Any) -> Any:
            if isinstance(value, dict):
                return {k: v.to(device) for k, v in value.items()}
            return value.to(device) if isinstance(value, Tensor) else value

        return PackedBatch(**{f.name: move(getattr(self, f.name)) for f in fields(self)})

    def block_causal_mask(self) -> Tensor:
        """``[R, 1, T, T]`` bool: i may attend to j iff ``j <= i`` and j is in i's segment or its
        parent (the group's shared prompt); padding attends to itself, so no mask row is empty."""
        if self.segment_R_T is not None and self.parent_R_T is not None:
            seg_R_T, parent_R_T = self.segment_R_T, self.parent_R_T
            same = (seg_R_T[:, None, :] == seg_R_T[:, :, None]) | (
                seg_R_T[:, None, :] == parent_R_T[:, :, None]
            )
        else:
            seg_R_T = (self.position_ids_R_T == 0).long().cumsum(dim=1)  # a new one at position 0
            same = seg_R_T[:, :, None] == seg_R_T[:, None, :]
        t = self.input_ids_R_T.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=same.device).tril()
        return (same & causal)[:, None, :, :]

    def per_sample(self, values_R_T: Tensor) -> list[Tensor]:
        """Each sample's values on its loss-masked completion positions, in sample order."""
        flat_index = self.sequence_index_R_T.reshape(-1)
        flat_values = values_R_T.reshape(-1)
        flat_mask = self.loss_mask_R_T.reshape(-1)
        return [flat_values[(flat_index == i) & flat_mask] for i in range(self.n_samples)]


def _check(sample: Sample, index: int, row_tokens: int) -> None:
    if len(sample.completion_ids) == 0 or sample.n_positions < 1:
        raise PackingError(f"sample {index}: needs a non-empty completion and >= 2 ids in total")
    if sample.n_positions > row_tokens:
        raise PackingError(
            f"sample {index}: {sample.n_positions + 1} ids do not fit a row of {row_tokens} "
            "positions; raise row_tokens or filter long samples"
        )
    n = len(sample.completion_ids)
    if sample.loss_mask is not None and len(sample.loss_mask) != n:
        raise PackingError(
            f"sample {index}: loss_mask has {len(sample.loss_mask)} entries for {n} completion ids"
        )
    for name, values in sample.token_values.items():
        if len(values) != n:
            raise PackingError(
                f"sample {index}: token_values[{name!r}] has {len(values)} entries for "
                f"{n} completion ids"
            )


def _validate(samples: Sequence[Sample], row_tokens: int, pad_to: int) -> list[str]:
    """Check every sample fits and carries the same token_values; returns their names."""
    if not samples:
        raise PackingError("no samples to pack")
    if row_tokens < 1 or pad_to < 1:
        raise PackingError(f"row_tokens and pad_to must be >= 1, got {row_tokens}, {pad_to}")
    for i, sample in enumerate(samples):
        _check(sample, i, row_tokens)
    names = sorted(samples[0].token_values)
    for i, sample in enumerate(samples):
        if sorted(sample.token_values) != names:
            raise PackingError(
                f"sample {i}: token_values keys {sorted(sample.token_values)} differ from "
                f"sample 0's {names}"
            )
    return names


def assign_rows(lengths: Sequence[int], row_tokens: int) -> list[list[int]]:
    """First-fit decreasing: sample indices per row, each row's lengths summing to at most
    ``row_tokens``; ties keep input order."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    rows: list[list[int]] = []
    free: list[int] = []
    for i in order:
        for r, space in enumerate(free):
            if lengths[i] <= space:
                rows[r].append(i)
                free[r] -= lengths[i]
                break
        else:
            rows.append([i])
            free.append(row_tokens - lengths[i])
    return rows


def pack(
    samples: Sequence[Sample], row_tokens: int, *, one_per_row: bool = False, pad_to: int = 1
) -> PackedBatch:
    """Pack ``samples`` into rows of at most ``row_tokens`` positions (``one_per_row``: a padded
    batch; ``pad_to``: row length rounded up to a multiple), one ``torch.from_numpy`` per field."""
    names = _validate(samples, row_tokens, pad_to)
    lengths = [s.n_positions for s in samples]
    rows = [[i] for i in range(len(samples))] if one_per_row else assign_rows(lengths, row_tokens)
    used = max(sum(lengths[i] for i in row) for row in rows)
    t = -(-used // pad_to) * pad_to
    row_of = np.zeros(len(samples), np.int64)
    start = np.zeros(len(samples), np.int64)
    seqlens: list[int] = []
    pads: list[tuple[int, int]] = []  # (row, offset) of each row's padding tail
    for row, members in enumerate(rows):
        offset = 0
        for i in members:
            row_of[i], start[i] = row, offset
            seqlens.append(lengths[i])
            offset += lengths[i]
        if offset < t:
            seqlens.append(t - offset)
            pads.append((row, offset))
    return _fill(samples, names, len(rows), t, row_of * t + start, seqlens, pads)


def ids_of(values: Ints) -> NDArray[np.int64]:
    """`values` as an int64 array (no copy when it already is one)."""
    return np.asarray(values, dtype=np.int64)


def concat(parts: list[NDArray[Any]], dtype: type) -> NDArray[Any]:
    """`parts` joined as one `dtype` array (empty: a 0-length one)."""
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


def _loss_mask(
    samples: Sequence[Sample], size: int, dest: NDArray[np.int64], at: NDArray[np.int64]
) -> NDArray[np.bool_]:
    """The flat loss mask: completion token ``at[k]`` (its mask, else True) at ``dest[k]``."""
    mask = concat(
        [
            np.ones(len(s.completion_ids), np.bool_)
            if s.loss_mask is None
            else np.asarray(s.loss_mask) != 0
            for s in samples
        ],
        np.bool_,
    )
    loss_mask = np.zeros(size, np.bool_)
    loss_mask[dest] = mask[at]
    return loss_mask


def _fill(
    samples: Sequence[Sample],
    names: list[str],
    n_rows: int,
    t: int,
    first: NDArray[np.int64],
    seqlens: list[int],
    pads: list[tuple[int, int]],
) -> PackedBatch:
    """The PackedBatch of `samples`, sample i from flat index `first[i]` of ``[n_rows, t]``."""
    n_pos = np.array([s.n_positions for s in samples], np.int64)
    n_prompt = np.array([len(s.prompt_ids) for s in samples], np.int64)
    n_comp = n_pos + 1 - n_prompt
    ids = concat(
        [np.concatenate((ids_of(s.prompt_ids), ids_of(s.completion_ids))) for s in samples],
        np.int64,
    )
    seq = np.repeat(np.arange(len(samples)), n_pos)  # each position's sample
    j = np.arange(int(n_pos.sum())) - np.repeat(np.cumsum(n_pos) - n_pos, n_pos)
    dest = first[seq] + j
    at = (np.cumsum(n_pos + 1) - (n_pos + 1))[seq] + j  # position j's input id in `ids`
    size = n_rows * t
    input_ids, targets = np.zeros(size, np.int64), np.zeros(size, np.int64)
    positions, seq_index = np.zeros(size, np.int64), np.full(size, -1, np.int64)
    input_ids[dest], targets[dest], positions[dest], seq_index[dest] = ids[at], ids[at + 1], j, seq
    for row, offset in pads:
        positions[row * t + offset : (row + 1) * t] = np.arange(t - offset)
    # Completion id c sits at sequence index P + c; its predicting position is P + c - 1.
    c = j - (n_prompt[seq] - 1)
    on = c >= 0
    at_c = ((np.cumsum(n_comp) - n_comp)[seq] + c)[on]
    loss_mask = _loss_mask(samples, size, dest[on], at_c)
    values = {}
    for name in names:
        flat = concat([np.asarray(s.token_values[name], np.float32) for s in samples], np.float32)
        out = np.zeros(size, np.float32)
        out[dest[on]] = flat[at_c]
        values[name] = torch.from_numpy(out).view(n_rows, t)
    cu = torch.zeros(len(seqlens) + 1, dtype=torch.int32)
    cu[1:] = torch.from_numpy(np.cumsum(np.array(seqlens, np.int64)).astype(np.int32))
    return PackedBatch(
        input_ids_R_T=torch.from_numpy(input_ids).view(n_rows, t),
        position_ids_R_T=torch.from_numpy(positions).view(n_rows, t),
        targets_R_T=torch.from_numpy(targets).view(n_rows, t),
        loss_mask_R_T=torch.from_numpy(loss_mask).view(n_rows, t),
        sequence_index_R_T=torch.from_numpy(seq_index).view(n_rows, t),
        values_R_T=values,
        cu_seqlens=cu,
        max_seqlen=max(seqlens),
        n_samples=len(samples),
    )


class _Layout:
    """The tensors of a `pack_shared` batch being filled, row by row."""

    def __init__(self, rows: int, t: int, names: list[str]) -> None:
        self.t = t
        self.input_ids = torch.zeros(rows, t, dtype=torch.long)
        self.targets = torch.zeros(rows, t, dtype=torch.long)
        self.positions = torch.zeros(rows, t, dtype=torch.long)
        self.loss_mask = torch.zeros(rows, t, dtype=torch.bool)
        self.seq_index = torch.full((rows, t), -1, dtype=torch.long)
        self.values = {name: torch.zeros(rows, t, dtype=torch.float32) for name in names}
        self.segment = torch.zeros(rows, t, dtype=torch.long)
        self.parent = torch.full((rows, t), -1, dtype=torch.long)
        self.seqlens: list[int] = []

    def completion(self, row: int, span: slice, sample: Sample) -> None:
        """The loss mask and per-token values of `sample` on the positions predicting its
        completion."""
        n = len(sample.completion_ids)
        mask = np.ones(n, np.bool_) if sample.loss_mask is None else np.asarray(sample.loss_mask)
        self.loss_mask[row, span] = torch.from_numpy(mask != 0)
        for name, tensor in self.values.items():
            tensor[row, span] = torch.from_numpy(np.asarray(sample.token_values[name], np.float32))

    def pad(self, row: int, offset: int, segment: int = 0) -> None:
        """The row's padding tail from `offset`: one segment of its own."""
        if offset < self.t:
            self.positions[row, offset:] = torch.arange(self.t - offset)
            self.segment[row, offset:] = segment
            self.seqlens.append(self.t - offset)

    def batch(self, n_samples: int) -> PackedBatch:
        cu = torch.zeros(len(self.seqlens) + 1, dtype=torch.int32)
        cu[1:] = torch.tensor(self.seqlens, dtype=torch.int32).cumsum(0)
        return PackedBatch(
            input_ids_R_T=self.input_ids,
            position_ids_R_T=self.positions,
            targets_R_T=self.targets,
            loss_mask_R_T=self.loss_mask,
            sequence_index_R_T=self.seq_index,
            values_R_T=self.values,
            cu_seqlens=cu,
            max_seqlen=max(self.seqlens),
            n_samples=n_samples,
            segment_R_T=self.segment,
            parent_R_T=self.parent,
        )


def _prompt_units(samples: Sequence[Sample], row_tokens: int) -> list[list[int]]:
    """Sample indices grouped by prompt, split so one prompt plus its completions fits a row."""
    by_prompt: dict[bytes, list[int]] = {}
    for i, s in enumerate(samples):
        by_prompt.setdefault(prompt_key(s.prompt_ids), []).append(i)
    units: list[list[int]] = []
    for members in by_prompt.values():
        unit: list[int] = []
        used = 0
        for i in members:
            s = samples[i]
            cost = len(s.completion_ids) if unit else s.n_positions
            if unit and used + cost > row_tokens:
                units.append(unit)
                unit, used, cost = [], 0, s.n_positions
            unit.append(i)
            used += cost
        units.append(unit)
    return units


def prompt_key(ids: Ints) -> bytes:
    """A hashable key equal for equal prompts (their int64 bytes)."""
    return ids_of(ids).tobytes()


def shared_positions(samples: Sequence[Sample]) -> int:
    """Positions `pack_shared` uses for `samples` (one prompt copy per distinct prompt)."""
    seen: set[bytes] = set()
    total = 0
    for s in samples:
        key = prompt_key(s.prompt_ids)
        total += len(s.completion_ids) if key in seen else s.n_positions
        seen.add(key)
    return total


def pack_shared(samples: Sequence[Sample], row_tokens: int, *, pad_to: int = 1) -> PackedBatch:
    """Like `pack`, but samples with the same prompt share one copy of it (each completion is a
    branch attending to the shared prompt and itself): same logprobs and gradients, ``P + sum(C_i)``
    positions per group instead of ``n * P + sum(C_i)``. Needs mask-based attention (eager, sdpa):
    `cu_seqlens` describe whole groups, so varlen kernels cannot run it."""
    names = _validate(samples, row_tokens, pad_to)
    units = _prompt_units(samples, row_tokens)
    unit_len = [shared_positions([samples[i] for i in u]) for u in units]
    rows = assign_rows(unit_len, row_tokens)
    t = -(-max(sum(unit_len[u] for u in row) for row in rows) // pad_to) * pad_to
    out = _Layout(len(rows), t, names)
    for row, row_units in enumerate(rows):
        offset, seg = 0, 0
        for u in row_units:
            members = units[u]
            prompt = ids_of(samples[members[0]].prompt_ids)
            p = len(prompt)
            shared_seg = seg
            if p > 1:  # the shared prompt, minus the last token each branch starts with
                span = slice(offset, offset + p - 1)
                out.input_ids[row, span] = torch.from_numpy(prompt[:-1])
                out.targets[row, span] = torch.from_numpy(prompt[1:])
                out.positions[row, span] = torch.arange(p - 1)
                out.segment[row, span] = seg
                out.seq_index[row, span] = members[0]
                offset += p - 1
            seg += 1
            for i in members:
                s = samples[i]
                n = len(s.completion_ids)
                span = slice(offset, offset + n)
                completion = ids_of(s.completion_ids)
                out.input_ids[row, span] = torch.from_numpy(
                    np.concatenate((prompt[-1:], completion[:-1]))
                )
                out.targets[row, span] = torch.from_numpy(completion)
                out.positions[row, span] = torch.arange(p - 1, p - 1 + n)
                out.segment[row, span] = seg
                out.parent[row, span] = shared_seg if p > 1 else -1
                out.seq_index[row, span] = i
                out.completion(row, span, s)
                offset += n
                seg += 1
            out.seqlens.append(unit_len[u])
        out.pad(row, offset, segment=seg)
    return out.batch(len(samples))

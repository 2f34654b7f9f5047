"""Sequence packing: many variable-length (prompt + completion) sequences in few dense rows.

A GRPO batch mixes completions of 100 and 2,000 tokens; padding each to the longest wastes most
of the compute. Packing places whole sequences one after another in rows of at most
``row_tokens`` positions (first-fit decreasing), restarts ``position_ids`` at 0 for every
sequence, and describes the boundaries twice:

- ``cu_seqlens`` / ``max_seqlen`` (int32 cumulative lengths over the row-major flattened batch),
  the layout of flash-attention's varlen kernels and of transformers' packed-sequence path
  (which reads boundaries from ``position_ids`` restarting at 0 when the batch is one row);
- :meth:`PackedBatch.block_causal_mask`, a ``[R, 1, T, T]`` boolean mask (True = may attend) for
  attention implementations without varlen support (eager, sdpa). It costs ``R * T * T`` bytes.

Targets are next-token aligned *within* each sequence: a sequence of ``L`` ids contributes
``L - 1`` positions (inputs ``ids[:-1]``, targets ``ids[1:]``), so no position ever predicts
the first token of the next sequence. Per-completion-token values (behavior logprobs,
advantages, teacher logprobs) are placed on the position whose target is that token.

Guarantees: every sequence lies whole in one row; padding (row tails) is its own segment with
``loss_mask`` False and ``sequence_index`` -1. Limits: a sequence longer than ``row_tokens + 1``
ids is an error, never silently truncated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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
    """One training sequence: ``prompt_ids`` then ``completion_ids``.

    ``loss_mask`` (optional) covers the completion only, one 0/1 per completion id; absent means
    every completion id is trained on. ``token_values`` maps a name (``behavior_logprobs``,
    ``advantages``, ``teacher_logprobs``...) to one float per completion id. Lists or numpy
    arrays (``stacx.train.batches`` gives views of the Arrow buffers).
    """

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
        return PackedBatch(
            input_ids_R_T=self.input_ids_R_T.to(device),
            position_ids_R_T=self.position_ids_R_T.to(device),
            targets_R_T=self.targets_R_T.to(device),
            loss_mask_R_T=self.loss_mask_R_T.to(device),
            sequence_index_R_T=self.sequence_index_R_T.to(device),
            values_R_T={k: v.to(device) for k, v in self.values_R_T.items()},
            cu_seqlens=self.cu_seqlens.to(device),
            max_seqlen=self.max_seqlen,
            n_samples=self.n_samples,
            segment_R_T=None if self.segment_R_T is None else self.segment_R_T.to(device),
            parent_R_T=None if self.parent_R_T is None else self.parent_R_T.to(device),
        )

    def block_causal_mask(self) -> Tensor:
        """``[R, 1, T, T]`` bool: position i may attend to j iff ``j <= i`` and j is in i's
        segment (or, with shared prompts, in i's parent segment: the group's prompt). Padding
        attends to itself only, so no row of the mask is empty."""
        if self.segment_R_T is not None and self.parent_R_T is not None:
            seg_R_T, parent_R_T = self.segment_R_T, self.parent_R_T
            same = (seg_R_T[:, None, :] == seg_R_T[:, :, None]) | (
                seg_R_T[:, None, :] == parent_R_T[:, :, None]
            )
        else:
            seg_R_T = _segment_ids(self.position_ids_R_T)
            same = seg_R_T[:, :, None] == seg_R_T[:, None, :]
        t = self.input_ids_R_T.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=same.device).tril()
        return (same & causal)[:, None, :, :]

    def per_sample(self, values_R_T: Tensor) -> list[Tensor]:
        """Split a per-position tensor into each sample's completion positions (in sample order):
        entry i has one value per completion id of sample i whose loss mask is set."""
        flat_index = self.sequence_index_R_T.reshape(-1)
        flat_values = values_R_T.reshape(-1)
        flat_mask = self.loss_mask_R_T.reshape(-1)
        return [flat_values[(flat_index == i) & flat_mask] for i in range(self.n_samples)]


def _segment_ids(position_ids_R_T: Tensor) -> Tensor:
    """Segment number of each position within its row: increments where position_ids == 0."""
    return (position_ids_R_T == 0).long().cumsum(dim=1)


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
    """First-fit decreasing bin packing: lists of sample indices per row (each row's lengths sum
    to at most ``row_tokens``). Deterministic: ties keep input order."""
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
    """Pack ``samples`` into rows of at most ``row_tokens`` positions.

    ``one_per_row=True`` gives a plain padded batch (one sample per row, rows padded to the
    longest) with the same fields, for baselines and for code paths that cannot pack.
    ``pad_to`` rounds the row length up to a multiple (tensor-core friendly shapes).
    Columnar: the ids, masks and values of all samples are laid out with numpy index arrays and
    become tensors by one ``torch.from_numpy`` per field (no tensor, no Python int per token).
    """
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


def _flat(parts: list[NDArray[Any]], dtype: type) -> NDArray[Any]:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


def _loss_mask(
    samples: Sequence[Sample], size: int, dest: NDArray[np.int64], at: NDArray[np.int64]
) -> NDArray[np.bool_]:
    """The flat loss mask: completion token ``at[k]`` of the samples' concatenated completions
    (its own ``loss_mask``, else True) at flat index ``dest[k]``."""
    mask = _flat(
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
    """The PackedBatch of `samples`, sample i's positions starting at flat index `first[i]`
    of the row-major ``[n_rows, t]`` layout."""
    n_pos = np.array([s.n_positions for s in samples], np.int64)
    n_prompt = np.array([len(s.prompt_ids) for s in samples], np.int64)
    n_comp = n_pos + 1 - n_prompt
    ids = _flat(
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
        flat = _flat([np.asarray(s.token_values[name], np.float32) for s in samples], np.float32)
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
    """The tensors of a PackedBatch being filled, row by row (`pack`, `pack_shared`)."""

    def __init__(self, rows: int, t: int, names: list[str], *, shared: bool = False) -> None:
        self.t = t
        self.input_ids = torch.zeros(rows, t, dtype=torch.long)
        self.targets = torch.zeros(rows, t, dtype=torch.long)
        self.positions = torch.zeros(rows, t, dtype=torch.long)
        self.loss_mask = torch.zeros(rows, t, dtype=torch.bool)
        self.seq_index = torch.full((rows, t), -1, dtype=torch.long)
        self.values = {name: torch.zeros(rows, t, dtype=torch.float32) for name in names}
        self.segment = torch.zeros(rows, t, dtype=torch.long) if shared else None
        self.parent = torch.full((rows, t), -1, dtype=torch.long) if shared else None
        self.seqlens: list[int] = []

    def completion(self, row: int, span: slice, sample: Sample) -> None:
        """The loss mask and per-token values of `sample` on the positions predicting its
        completion ids."""
        n = len(sample.completion_ids)
        mask = np.ones(n, np.bool_) if sample.loss_mask is None else np.asarray(sample.loss_mask)
        self.loss_mask[row, span] = torch.from_numpy(mask != 0)
        for name, tensor in self.values.items():
            tensor[row, span] = torch.from_numpy(np.asarray(sample.token_values[name], np.float32))

    def pad(self, row: int, offset: int, segment: int = 0) -> None:
        """The row's padding tail from `offset`: one segment of its own."""
        if offset < self.t:
            self.positions[row, offset:] = torch.arange(self.t - offset)
            if self.segment is not None:
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
    """Sample indices grouped by identical prompt (first-appearance order), each group split
    so that one prompt copy plus its completions fits a row."""
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
    """Like `pack`, but samples with the same prompt (a GRPO group: n completions of one task)
    share one copy of it: the prompt minus its last token is a segment of its own, and each
    completion is a branch ``[last prompt token, completion[:-1]]`` whose positions continue
    the prompt's and whose attention sees the shared prompt and its own branch only
    (`block_causal_mask`). Logprobs and gradients equal `pack`'s; the forward costs
    ``P + sum(C_i)`` positions per group instead of ``n * P + sum(C_i)``.

    Needs mask-based attention (eager, sdpa): `cu_seqlens` describe whole groups, not the
    attention pattern, so varlen kernels cannot run a shared batch.
    """
    names = _validate(samples, row_tokens, pad_to)
    units = _prompt_units(samples, row_tokens)
    unit_len = [shared_positions([samples[i] for i in u]) for u in units]
    rows = assign_rows(unit_len, row_tokens)
    t = -(-max(sum(unit_len[u] for u in row) for row in rows) // pad_to) * pad_to
    out = _Layout(len(rows), t, names, shared=True)
    assert out.segment is not None and out.parent is not None
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

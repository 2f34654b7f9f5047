"""View rows (Arrow) as training samples: a LIST column is read through its Arrow offsets and values
buffers, never a Python object per token. Guarantees: a NULL where a value is needed, or a per-token
list of the wrong length, raises :class:`BatchError` naming the column, episode and turn; nothing is
dropped or padded.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from stacx.errors import StacxError
from stacx.train.packing import Sample


class BatchError(StacxError):
    """View rows cannot be turned into training samples."""


Offsets = NDArray[np.int64]


def _where(table: pa.Table, i: int) -> str:
    parts = [f"row {i}"]
    for key in ("episode_id", "turn"):
        if key in table.column_names:
            parts.append(f"{key}={table.column(key)[i].as_py()}")
    return ", ".join(parts)


def list_buffers(table: pa.Table, name: str) -> tuple[Offsets, np.ndarray, NDArray[np.bool_]]:
    """LIST column `name` as (offsets from 0, one per row + 1; the flat values; which rows are
    NULL): Arrow's own buffers, copied only for several chunks. A NULL element raises BatchError."""
    col = table.column(name)
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
        raise BatchError(f"column {name!r} is {arr.type}, not a list")
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    flat = arr.flatten()
    if flat.null_count:
        first = int(np.flatnonzero(flat.is_null().to_numpy(zero_copy_only=False))[0])
        row = int(np.searchsorted(offsets - offsets[0], first, side="right")) - 1
        raise BatchError(f"{_where(table, row)}: column {name!r} holds a NULL")
    nulls = arr.is_null().to_numpy(zero_copy_only=False)
    return offsets - offsets[0], flat.to_numpy(zero_copy_only=False), nulls


def _lengths_of(
    table: pa.Table, name: str, n: NDArray[np.int64], what: str
) -> tuple[Offsets, np.ndarray]:
    """LIST column `name` whose row i must hold n[i] entries (else BatchError: `what`)."""
    offsets, values, nulls = list_buffers(table, name)
    got = np.diff(offsets)
    bad = np.flatnonzero(nulls | (got != n))
    if bad.size:
        i = int(bad[0])
        had = "NULL" if nulls[i] else f"{got[i]} values"
        raise BatchError(f"{_where(table, i)}: column {name!r} needs {n[i]} {what}, got {had}")
    return offsets, values


def _scalars(table: pa.Table, name: str) -> NDArray[np.float64]:
    col = table.column(name)
    if not (
        pa.types.is_integer(col.type)
        or pa.types.is_floating(col.type)
        or pa.types.is_decimal(col.type)
    ):
        raise BatchError(f"column {name!r} is {col.type}, not a number")
    if col.null_count:
        i = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise BatchError(f"{_where(table, i)}: column {name!r} is None, not a number")
    return np.asarray(pc.cast(col, pa.float64()).to_numpy(), dtype=np.float64)


def samples_from_table(
    table: pa.Table,
    *,
    prompt: str | None = "prompt_ids",
    completion: str = "completion_ids",
    token_columns: Mapping[str, str] | None = None,
    scalar_columns: Mapping[str, str] | None = None,
    loss_mask: str | None = None,
) -> list[Sample]:
    """One :class:`Sample` per row, its fields numpy views of the columns' buffers.

    ``token_columns``: value name -> LIST column, one float per completion id; ``scalar_columns``:
    value name -> numeric column broadcast over the completion; ``loss_mask``: a 0/1 LIST column;
    ``prompt=None``: rows read without prompts (:func:`chain_sequences` supplies them)."""
    token_columns = dict(token_columns or {})
    scalar_columns = dict(scalar_columns or {})
    clash = set(token_columns) & set(scalar_columns)
    if clash:
        raise BatchError(f"value names given as both token and scalar columns: {sorted(clash)}")
    wanted = [*([prompt] if prompt else []), completion, *token_columns.values()]
    wanted += [*scalar_columns.values(), *([loss_mask] if loss_mask else [])]
    missing = sorted({c for c in wanted if c not in table.column_names})
    if missing:
        raise BatchError(f"columns {missing} not in the result; it has {table.column_names}")
    c_off, c_ids, c_null = list_buffers(table, completion)
    if prompt:
        p_off, p_ids, p_null = list_buffers(table, prompt)
    else:
        p_off, p_ids = np.zeros(table.num_rows + 1, np.int64), c_ids[:0]
        p_null = np.zeros(table.num_rows, np.bool_)
    if (c_null | p_null).any():
        i = int(np.flatnonzero(c_null | p_null)[0])
        raise BatchError(f"{_where(table, i)}: {prompt} or {completion} is NULL")
    n = np.diff(c_off)
    values: dict[str, np.ndarray] = {}
    for name, col in token_columns.items():
        _, flat = _lengths_of(table, col, n, "floats (one per completion id)")
        values[name] = flat.astype(np.float32, copy=False)
    for name, col in scalar_columns.items():
        values[name] = np.repeat(_scalars(table, col).astype(np.float32), n)
    mask = None
    if loss_mask is not None:
        mask = _lengths_of(table, loss_mask, n, "0/1 entries (one per completion id)")[1]
    return [
        Sample(
            p_ids[p_off[i] : p_off[i + 1]],
            c_ids[c_off[i] : c_off[i + 1]],
            {k: v[c_off[i] : c_off[i + 1]] for k, v in values.items()},
            None if mask is None else mask[c_off[i] : c_off[i + 1]],
        )
        for i in range(table.num_rows)
    ]

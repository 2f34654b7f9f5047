"""DuckDB schema derived from the event catalog, the single source of truth: one table per kind
(``turn_generated``), one typed column per field plus ``_seq``, and the bookkeeping tables
(``_events``, ``_position``, ``_dead_letters``). Opening a file adds the columns the catalog
gained since; nothing is ever dropped or retyped. Design: docs/concepts/log.md
"""

from __future__ import annotations

import re
import types
import typing
from dataclasses import dataclass
from enum import Enum

import duckdb
import msgspec
import numpy as np
import pyarrow as pa

from stacx.events import KINDS, Event
from stacx.wire import PACKED, packed_array

_SCALARS: dict[type, tuple[str, pa.DataType]] = {
    bool: ("BOOLEAN", pa.bool_()),
    int: ("BIGINT", pa.int64()),
    float: ("DOUBLE", pa.float64()),
    str: ("VARCHAR", pa.string()),
}
_LISTS: dict[type, tuple[str, pa.DataType]] = {
    int: ("INTEGER[]", pa.list_(pa.int32())),
    float: ("DOUBLE[]", pa.list_(pa.float64())),
    str: ("VARCHAR[]", pa.list_(pa.string())),
}


def table_name(kind: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", kind).lower()


@dataclass(frozen=True)
class Column:
    name: str
    sql_type: str
    arrow_type: pa.DataType


def _column(name: str, hint: object) -> Column:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"field {name}: only `X | None` unions are storable, got {hint}")
        return _column(name, args[0])
    if origin is list:
        (item,) = typing.get_args(hint)
        return Column(name, *_LISTS[item])
    if isinstance(hint, type) and issubclass(hint, Enum):
        return Column(name, "VARCHAR", pa.string())
    if isinstance(hint, type) and hint in _SCALARS:
        return Column(name, *_SCALARS[hint])
    raise TypeError(f"field {name}: no column type for {hint!r}")


@dataclass(frozen=True)
class KindTable:
    kind: str
    name: str
    columns: tuple[Column, ...]  # the Struct's fields, then _seq

    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema([(c.name, c.arrow_type) for c in self.columns])

    def ddl(self) -> str:
        cols = ", ".join(f'"{c.name}" {c.sql_type}' for c in self.columns)
        return f'CREATE TABLE IF NOT EXISTS "{self.name}" ({cols})'


def kind_table(cls: type[Event]) -> KindTable:
    hints = typing.get_type_hints(cls)
    cols = [_column(f, hints[f]) for f in cls.__struct_fields__]
    cols.append(Column("_seq", "BIGINT", pa.int64()))
    return KindTable(cls.__name__, table_name(cls.__name__), tuple(cols))


TABLES: dict[str, KindTable] = {kind: kind_table(cls) for kind, cls in KINDS.items()}

_EVENTS_COLUMNS = (
    "_seq BIGINT, event_id VARCHAR, kind VARCHAR, run_id VARCHAR, ts DOUBLE, episode_id VARCHAR"
)
_DEAD_COLUMNS = "_seq BIGINT, subject VARCHAR, reason VARCHAR, payload BLOB, recorded_ts DOUBLE"
BOOKKEEPING = [
    "CREATE TABLE IF NOT EXISTS _position (stream VARCHAR PRIMARY KEY, seq BIGINT NOT NULL)",
    f"CREATE TABLE IF NOT EXISTS _events ({_EVENTS_COLUMNS})",
    f"CREATE TABLE IF NOT EXISTS _dead_letters ({_DEAD_COLUMNS})",
    "CREATE TABLE IF NOT EXISTS _meta (key VARCHAR PRIMARY KEY, value VARCHAR)",
]
_ARROW = {"BIGINT": pa.int64(), "VARCHAR": pa.string(), "DOUBLE": pa.float64(), "BLOB": pa.binary()}


def _arrow_schema(columns: str) -> pa.Schema:
    """The Arrow schema of a bookkeeping table's SQL column list (one DDL, one truth)."""
    return pa.schema([(n, _ARROW[t]) for n, t in (c.split() for c in columns.split(", "))])


EVENTS_SCHEMA = _arrow_schema(_EVENTS_COLUMNS)
DEAD_SCHEMA = _arrow_schema(_DEAD_COLUMNS)


def create_all(con: duckdb.DuckDBPyConnection) -> None:
    """Create every table (idempotent); add the columns the catalog gained since."""
    for stmt in BOOKKEEPING:
        con.execute(stmt)
    for t in TABLES.values():
        con.execute(t.ddl())
        have = {
            r[0]
            for r in con.execute(
                "select column_name from information_schema.columns where table_name = ?", [t.name]
            ).fetchall()
        }
        for c in t.columns:
            if c.name not in have:
                con.execute(f'ALTER TABLE "{t.name}" ADD COLUMN "{c.name}" {c.sql_type}')
    con.execute("INSERT OR IGNORE INTO _meta VALUES ('format', 'stacx-trace-v1')")
    # Files of earlier versions kept every id again in ``_event_ids`` (a primary key, whose
    # index cost each commit ~3 ms and grew with the run); ``_events`` holds the same ids. The
    # table goes, and so does its marker, so that an older writer re-indexes the ids if it
    # opens this file again.
    con.execute("DROP TABLE IF EXISTS _event_ids")
    con.execute("DELETE FROM _meta WHERE key = 'event_ids'")


def to_arrow(kind: str, events: list[Event], seqs: list[int]) -> pa.Table:
    """Columnar batch of one kind, in the table's column order; packed token arrays become LIST
    columns through numpy, with no Python object per token."""
    table = TABLES[kind]
    packed = PACKED.get(kind, {})
    arrays = []
    for c in table.columns[:-1]:
        values = [getattr(e, c.name) for e in events]
        if c.name in packed:
            arrays.append(_list_array(values, packed[c.name], c.arrow_type))
        else:
            arrays.append(pa.array(values, type=c.arrow_type))
    arrays.append(pa.array(seqs, type=pa.int64()))
    return pa.Table.from_arrays(arrays, schema=table.arrow_schema)


def _list_array(values: list[object], code: int, arrow_type: pa.DataType) -> pa.Array:
    """A LIST column from packed arrays (or lists, or None): one offsets, one values buffer."""
    parts = [packed_array(v, code) for v in values if v is not None]
    lengths = np.zeros(len(values), np.int32)
    lengths[[i for i, v in enumerate(values) if v is not None]] = [len(a) for a in parts]
    offsets = np.zeros(len(values) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    item = arrow_type.value_type
    flat = np.concatenate(parts) if parts else np.zeros(0, item.to_pandas_dtype())
    nulls = [v is None for v in values]
    return pa.ListArray.from_arrays(
        pa.array(offsets), pa.array(flat, type=item), mask=pa.array(nulls) if any(nulls) else None
    )


def to_builtins(event: Event) -> dict[str, object]:
    """A plain dict of the event (with `kind`), e.g. for JSON output."""
    out: dict[str, object] = msgspec.to_builtins(event)
    return out

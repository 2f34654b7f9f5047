"""A real run database (DuckDB file, tables from the catalog, every view loaded) and a way to
write hand-built events into it the way the recorder does (Arrow batches per kind, with _seq)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from stacx.events import Event
from stacx.store.db import open_writer
from stacx.store.schema import TABLES, to_arrow


class Log:
    """Appends events to a run database; `_seq` grows across calls as on a stream."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        self.seq = 0

    def write(self, *events: Event) -> None:
        by_kind: dict[str, list[tuple[Event, int]]] = defaultdict(list)
        for event in events:
            self.seq += 1
            by_kind[event.kind].append((event, self.seq))
        for kind, items in by_kind.items():
            batch = to_arrow(kind, [e for e, _ in items], [s for _, s in items])
            self.con.register("_batch", batch)
            self.con.execute(f'INSERT INTO "{TABLES[kind].name}" SELECT * FROM _batch')
            self.con.unregister("_batch")

    def rows(self, sql: str, params: dict[str, object] | None = None) -> list[dict[str, object]]:
        cur = self.con.execute(sql, params) if params else self.con.execute(sql)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    con = open_writer(tmp_path / "run")
    try:
        yield Log(con)
    finally:
        con.close()

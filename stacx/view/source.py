"""The runs a viewer reads: one read-only, locked-down DuckDB connection over their logs (re-opened
when a live run's files change), typed queries on throwaway connections with a time limit, and the
runs' tokenizers. A viewer for one person: one query at a time.

Design: docs/view.md#what-the-viewer-guarantees
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from stacx.errors import StacxError
from stacx.store import db

Row = tuple[object, ...]


class QueryInterrupted(StacxError):
    """A typed query ran past the viewer's time limit and was interrupted."""


@dataclass
class Result:
    columns: list[str]
    rows: list[Row]

    def dicts(self) -> list[dict[str, object]]:
        return [dict(zip(self.columns, r, strict=True)) for r in self.rows]


def _signature(run_dirs: Sequence[Path]) -> tuple[tuple[int, int], ...]:
    out = []
    for d in run_dirs:
        for f in (db.db_path(d), db.wal_path(d)):
            try:
                st = f.stat()
                out.append((st.st_size, st.st_mtime_ns))
            except FileNotFoundError:
                out.append((-1, -1))
    return tuple(out)


def _files(con: duckdb.DuckDBPyConnection) -> list[Path]:
    """The log files this connection reads (the runs' own, or snapshot copies), in run order."""
    rows = con.execute(
        "select path from duckdb_databases() where path is not null and not internal "
        "order by database_oid"
    ).fetchall()
    return [Path(str(p)) for (p,) in rows]


def _snapshot_dirs(files: list[Path]) -> list[Path]:
    """The temp directories (``stacx-snap-*``) of the snapshot copies among ``files``."""
    tmp = Path(tempfile.gettempdir()).resolve()
    parents = [f.resolve().parent for f in files]
    return [p for p in parents if p.parent == tmp and p.name.startswith("stacx-snap-")]


@dataclass
class Source:
    """The viewed runs (in the order given: run 0 is ``r0`` in ``stacx sql``'s naming)."""

    run_dirs: list[Path]
    min_reopen_s: float = 1.0
    sql_timeout_s: float = 5.0
    _files: list[Path] = field(default_factory=list)
    _con: duckdb.DuckDBPyConnection | None = None
    _snaps: list[Path] = field(default_factory=list)
    _sig: tuple[tuple[int, int], ...] = ()
    _opened: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _tokenizers: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.run_dirs = [db.require_run(d) for d in self.run_dirs]

    # ---- connection -------------------------------------------------------------------------

    def _connection(self) -> duckdb.DuckDBPyConnection:
        now = time.monotonic()
        if self._con is not None and now - self._opened < self.min_reopen_s:
            return self._con
        sig = _signature(self.run_dirs)
        if self._con is not None and sig == self._sig:
            self._opened = now
            return self._con
        con = (
            db.connect_run(self.run_dirs[0])
            if len(self.run_dirs) == 1
            else db.attach_runs(list(self.run_dirs))
        )
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        self.close()
        self._con, self._sig, self._opened = con, sig, now
        self._files = _files(con)
        self._snaps = _snapshot_dirs(self._files)
        return con

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None
        for d in self._snaps:
            shutil.rmtree(d, ignore_errors=True)
        self._snaps = []

    def query(self, sql: str, params: Sequence[object] = ()) -> Result:
        """One of the viewer's own queries, with bound parameters."""
        with self._lock:
            cur = self._connection().execute(sql, list(params))
            cols = [d[0] for d in cur.description or []]
            return Result(cols, cur.fetchall() if cur.description else [])

    def query_user(self, sql: str, limit: int = 1000) -> tuple[Result, bool]:
        """A typed query on a throwaway connection: at most ``limit`` rows, whether more exist."""
        with self._lock:
            self._connection()
            files = list(self._files)
        con = db.attach_files(files)
        timer = threading.Timer(self.sql_timeout_s, con.interrupt)
        try:
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
            timer.start()
            cur = con.execute(sql)
            cols = [d[0] for d in cur.description or []]
            rows = cur.fetchmany(limit + 1) if cur.description else []
        except duckdb.InterruptException as exc:
            raise QueryInterrupted(
                f"query interrupted after {self.sql_timeout_s:g} s, the viewer's time limit "
                "(stacx view --sql-timeout SECONDS sets it)"
            ) from exc
        except duckdb.Error as exc:
            raise StacxError(str(exc)) from exc
        finally:
            timer.cancel()
            con.close()
        return Result(cols, rows[:limit]), len(rows) > limit

    def has(self, name: str) -> bool:
        """Whether a table or view of that name is loaded (an older log may lack a view)."""
        r = self.query(
            "select count(*) from (select table_name as n from duckdb_tables() "
            "union all select view_name from duckdb_views()) where n = ?",
            [name],
        )
        return bool(r.rows[0][0])

    # ---- run metadata -----------------------------------------------------------------------

    def run_files(self) -> list[dict[str, object]]:
        """Each run's ``run.json`` (status, pid), as written by the launcher."""
        return [db.read_run_file(d) for d in self.run_dirs]

    def model_spec(self, run_id: str) -> str | None:
        """The model a run generated with, from its resolved recipe (the first RunStarted)."""
        r = self.query(
            "select config_json from run_started where run_id = ? order by _seq limit 1", [run_id]
        )
        return model_of(str(r.rows[0][0])) if r.rows else None

    def tokenizer(self, run_id: str, load: Callable[[str | None], object]) -> object:
        """The run's tokenizer, loaded once per model by ``load`` (None: the default model)."""
        spec = self.model_spec(run_id) or "default"
        if spec not in self._tokenizers:
            self._tokenizers[spec] = load(spec)
        return self._tokenizers[spec]


def model_of(config_json: str) -> str | None:
    """The model of a resolved recipe (``model.path`` or ``model.name``, or ``model`` itself)."""
    model = json.loads(config_json).get("model")
    if isinstance(model, dict):
        found = model.get("path") or model.get("name")
        return str(found) if found else None
    return model if isinstance(model, str) else None

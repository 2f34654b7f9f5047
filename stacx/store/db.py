"""Opening run directories and their trace store.

A run directory holds ``trace.duckdb`` (the log: plain DuckDB, readable with no STACX code),
``run.json`` (run id, recipe, pid of the live launcher), ``nats/`` (the embedded server's
JetStream storage) and whatever the engines write (checkpoints/, metrics/).

Views: every ``events/views/*.sql`` file (the project's, then the directories in
``STACX_VIEWS_PATH``, colon-separated) is executed in filename order on open, so a user adds a
view by dropping a file in. A view that fails to load is reported with its file name.

DuckDB is single-writer across processes: while a run is live its recorder holds the file.
``connect_run`` then reads a snapshot copy, so ``stacx sql`` works on live runs too.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

import duckdb

from stacx.errors import NotARunError, StacxError
from stacx.store.schema import create_all

DB_FILE = "trace.duckdb"
RUN_FILE = "run.json"
VIEWS_DIR = Path(__file__).resolve().parents[2] / "events" / "views"


def quote_ident(name: str) -> str:
    """A DuckDB identifier, quoted (for names, where a bound parameter cannot go)."""
    return '"' + name.replace('"', '""') + '"'


def db_path(run_dir: Path | str) -> Path:
    return Path(run_dir) / DB_FILE


def wal_path(run_dir: Path | str) -> Path:
    """DuckDB's write-ahead log of the trace (committed, not yet checkpointed into the file)."""
    return db_path(run_dir).with_suffix(".duckdb.wal")


def is_run(path: Path | str) -> bool:
    return db_path(path).is_file() or (Path(path) / RUN_FILE).is_file()


def require_run(path: Path | str) -> Path:
    p = Path(path)
    if not p.exists():
        raise NotARunError(f"{p}: no such directory")
    if not db_path(p).is_file():
        raise NotARunError(f"{p}: not a STACX run (no {DB_FILE})")
    return p


def view_files() -> list[Path]:
    dirs = [VIEWS_DIR] + [Path(d) for d in os.environ.get("STACX_VIEWS_PATH", "").split(":") if d]
    files: dict[str, Path] = {}
    for d in dirs:
        if d.is_dir():
            for f in d.glob("*.sql"):
                files[f.name] = f  # a user's file of the same name overrides the project's
    return [files[n] for n in sorted(files)]


def load_views(con: duckdb.DuckDBPyConnection, schema: str | None = None) -> None:
    if schema:
        con.execute(f"USE {quote_ident(schema)}")
    for f in view_files():
        try:
            con.execute(f.read_text())
        except duckdb.Error as exc:
            raise StacxError(f"view file {f} failed to load: {exc}") from exc


# Rows per row group of the tables the writer appends to (DuckDB's minimum; its default is
# 122,880). A vacuuming checkpoint rewrites partly filled row groups whole: with the default its
# stall grew with the run (TurnGenerated's token lists: 420 ms after 100k events, bare file),
# with 2,048 it stayed below ~65 ms. The recorder vacuums only when idle (stacx.store.recorder),
# where this bounds the merge; its hot-path checkpoints (no vacuum) cost about the same either way.
ROW_GROUP_SIZE = 2048
WRITER_DB = "trace"  # the name the writer's connection knows the file by


def writer_cursor(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """Another cursor on `con` from ``open_writer``, on the trace (a new cursor starts in
    DuckDB's in-memory default database, which holds no tables)."""
    cur = con.cursor()
    cur.execute(f"USE {WRITER_DB}")
    return cur


def open_writer(run_dir: Path | str) -> duckdb.DuckDBPyConnection:
    """The recorder's read-write connection (the file attached as its default database);
    creates tables and views."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    con.execute(
        f"ATTACH ? AS {WRITER_DB} (ROW_GROUP_SIZE {ROW_GROUP_SIZE})", [str(db_path(run_dir))]
    )
    con.execute(f"USE {WRITER_DB}")
    create_all(con)
    load_views(con)
    return con


def _locked(exc: duckdb.Error) -> bool:
    msg = str(exc).lower()
    return "lock" in msg or "conflicting" in msg


def connect_run(run_dir: Path | str) -> duckdb.DuckDBPyConnection:
    """A read-only connection to one run with views loaded (a snapshot if the run is live)."""
    run_dir = require_run(run_dir)
    try:
        con = duckdb.connect(str(db_path(run_dir)), read_only=True)
    except duckdb.Error as exc:
        if not _locked(exc):
            raise
        con = duckdb.connect(str(_snapshot(run_dir)), read_only=True)
    load_views_readonly(con)
    return con


def _snapshot(run_dir: Path) -> Path:
    """Copy a live run's file (and WAL) aside; the copy opens as it was at the last checkpoint+WAL."""
    tmp = Path(tempfile.mkdtemp(prefix="stacx-snap-")) / DB_FILE
    shutil.copy2(db_path(run_dir), tmp)
    wal = wal_path(run_dir)
    if wal.exists():
        shutil.copy2(wal, tmp.with_suffix(".duckdb.wal"))
    return tmp


def load_views_readonly(con: duckdb.DuckDBPyConnection) -> None:
    """Views on a read-only database live in the in-memory temp schema.

    A log written by an older STACX may lack a column or an event table a newer view uses (the
    writer adds them on open; a reader cannot): such a view is skipped with a warning naming its
    file, and the rest of the log stays queryable."""
    for f in view_files():
        sql = f.read_text().replace("CREATE OR REPLACE VIEW", "CREATE OR REPLACE TEMP VIEW")
        try:
            con.execute(sql)
        except duckdb.Error as exc:
            if "Binder Error" not in str(exc) and "Catalog Error: Table with name" not in str(exc):
                raise StacxError(f"view file {f} failed to load: {exc}") from exc
            warnings.warn(f"view file {f} skipped for this log: {exc}", stacklevel=2)


def attach_runs(run_dirs: list[Path | str]) -> duckdb.DuckDBPyConnection:
    """An in-memory connection with several runs attached and views over their union.

    Each run is attached as ``r0``, ``r1``, ...; every event table is then a view over the
    union of the runs' tables (``UNION ALL BY NAME``), so the project views (and the users'
    queries) see all runs together."""
    con = duckdb.connect()
    for i, d in enumerate(run_dirs):
        d = require_run(d)
        try:
            con.execute(f"ATTACH ? AS r{i} (READ_ONLY)", [str(db_path(d))])
        except duckdb.Error as exc:
            if not _locked(exc):
                raise
            con.execute(f"ATTACH ? AS r{i} (READ_ONLY)", [str(_snapshot(d))])
    _union_views(con, len(run_dirs))
    load_views_readonly(con)
    return con


def attach_files(files: Sequence[Path]) -> duckdb.DuckDBPyConnection:
    """A fresh in-memory DuckDB instance over log files (each attached read-only as ``r0``,
    ``r1``, ...; one file is the default database, several are read through union views), with
    the project views loaded. Nothing done on it outlives it: the files are read-only and the
    in-memory catalog dies with the connection (the viewer runs each typed query on one)."""
    con = duckdb.connect()
    for i, f in enumerate(files):
        con.execute(f"ATTACH ? AS r{i} (READ_ONLY)", [str(f)])
    if len(files) == 1:
        con.execute("USE r0")
    else:
        _union_views(con, len(files))
    load_views_readonly(con)
    return con


def _union_views(con: duckdb.DuckDBPyConnection, n_runs: int) -> None:
    names = [f"r{i}" for i in range(n_runs)]
    tables = [
        r[0]
        for r in con.execute(
            "select distinct table_name from duckdb_tables() where database_name = 'r0'"
        ).fetchall()
    ]
    for t in tables:
        union = " UNION ALL BY NAME ".join(f"SELECT * FROM {n}.{quote_ident(t)}" for n in names)
        con.execute(f"CREATE OR REPLACE TEMP VIEW {quote_ident(t)} AS {union}")


def read_run_file(run_dir: Path | str) -> dict[str, object]:
    f = Path(run_dir) / RUN_FILE
    if not f.is_file():
        return {}
    data: dict[str, object] = json.loads(f.read_text())
    return data


def write_run_file(run_dir: Path | str, data: dict[str, object]) -> None:
    f = Path(run_dir) / RUN_FILE
    tmp = f.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(f)

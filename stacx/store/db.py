"""Opening run directories and their log (``trace.duckdb``, plain DuckDB) with the views loaded
(``events/views/*.sql``, then $STACX_VIEWS_PATH's, in filename order). DuckDB has one writer
across processes, so a live run is read through a snapshot copy.
Design: docs/concepts/log.md
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TypeVar

import duckdb

from stacx.errors import NotARunError, StacxError
from stacx.store.schema import create_all

DB_FILE = "trace.duckdb"
RUN_FILE = "run.json"
VIEWS_DIR = Path(__file__).resolve().parents[2] / "events" / "views"
T = TypeVar("T")


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
    """Another cursor on `con`, on the trace (a new one starts in DuckDB's empty memory db)."""
    cur = con.cursor()
    cur.execute(f"USE {WRITER_DB}")
    return cur


def open_writer(run_dir: Path | str) -> duckdb.DuckDBPyConnection:
    """The recorder's read-write connection (the file as default database); makes tables, views."""
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


def _open_live(run_dir: Path, open_file: Callable[[str], T]) -> T:
    """`open_file` of the run's trace, or of a snapshot copy when a writer holds its lock."""
    try:
        return open_file(str(db_path(run_dir)))
    except duckdb.Error as exc:
        msg = str(exc).lower()
        if "lock" not in msg and "conflicting" not in msg:
            raise
        return open_file(str(_snapshot(run_dir)))


def connect_run(run_dir: Path | str) -> duckdb.DuckDBPyConnection:
    """A read-only connection to one run with views loaded (a snapshot if the run is live)."""
    con = _open_live(require_run(run_dir), lambda f: duckdb.connect(f, read_only=True))
    load_views_readonly(con)
    return con


def _snapshot(run_dir: Path) -> Path:
    """Copy a live run's file (and WAL) aside; it opens as it was at the last checkpoint + WAL."""
    tmp = Path(tempfile.mkdtemp(prefix="stacx-snap-")) / DB_FILE
    shutil.copy2(db_path(run_dir), tmp)
    wal = wal_path(run_dir)
    if wal.exists():
        shutil.copy2(wal, tmp.with_suffix(".duckdb.wal"))
    return tmp


def load_views_readonly(con: duckdb.DuckDBPyConnection) -> None:
    """Views on a read-only database, in the in-memory temp schema; a view an older log lacks
    columns or tables for is skipped with a warning naming its file (a reader cannot add them)."""
    for f in view_files():
        sql = f.read_text().replace("CREATE OR REPLACE VIEW", "CREATE OR REPLACE TEMP VIEW")
        try:
            con.execute(sql)
        except duckdb.Error as exc:
            if "Binder Error" not in str(exc) and "Catalog Error: Table with name" not in str(exc):
                raise StacxError(f"view file {f} failed to load: {exc}") from exc
            warnings.warn(f"view file {f} skipped for this log: {exc}", stacklevel=2)


def attach_runs(run_dirs: list[Path | str]) -> duckdb.DuckDBPyConnection:
    """An in-memory connection with runs attached as ``r0``, ``r1``, ..., every event table a
    ``UNION ALL BY NAME`` view over theirs, so views and queries see all runs together."""
    con = duckdb.connect()
    for i, d in enumerate(run_dirs):
        _open_live(require_run(d), partial(_attach, con, f"r{i}"))
    _union_views(con, len(run_dirs))
    load_views_readonly(con)
    return con


def attach_files(files: Sequence[Path]) -> duckdb.DuckDBPyConnection:
    """A fresh in-memory DuckDB over log files attached read-only (as in `attach_runs`; one file
    is the default database), views loaded; nothing done on it outlives the connection."""
    con = duckdb.connect()
    for i, f in enumerate(files):
        _attach(con, f"r{i}", str(f))
    if len(files) == 1:
        con.execute("USE r0")
    else:
        _union_views(con, len(files))
    load_views_readonly(con)
    return con


def _attach(con: duckdb.DuckDBPyConnection, name: str, path: str) -> None:
    con.execute(f"ATTACH ? AS {name} (READ_ONLY)", [path])


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


def update_run_file(run_dir: Path | str, fields: dict[str, object]) -> None:
    """Set `fields` in ``run.json``, keeping the others (atomic: a reader sees old or new)."""
    f = Path(run_dir) / RUN_FILE
    tmp = f.with_suffix(".tmp")
    tmp.write_text(json.dumps({**read_run_file(run_dir), **fields}, indent=2, sort_keys=True))
    tmp.replace(f)

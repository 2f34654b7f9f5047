"""DuckDB's write-ahead log for LIST columns under the recorder's commit pattern.

The recorder commits every fetched batch (tens to hundreds of rows per table) to a file opened
as ``stacx.store.db.open_writer`` opens it (row groups of 2,048 rows, checkpoints run by the
recorder). This bench appends the same TurnGenerated token lists (256-id prompt and output,
logprobs; tools/bench/synthetic.py) to such a file three ways and reports the WAL bytes each
commit writes:
  1. ``small``: ``--commits`` commits of ``--rows`` rows each, into INTEGER[]/DOUBLE[] columns,
     as the recorder writes TurnGenerated;
  2. ``one``: the same rows in one commit (the baseline: what the data takes);
  3. ``blob``: the small commits again, each list packed as a BLOB of the same bytes.
Prints one JSON line: WAL bytes per Arrow byte for each, and the WAL of the last small commit
against the first's (1.0: each commit writes only its own rows).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from stacx.store import db  # noqa: E402


def token_rows(n: int, tokens: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 49152, size=(n, tokens), dtype=np.int32)
    lps = -rng.random(size=(n, tokens))
    offsets = pa.array(np.arange(0, n * tokens + 1, tokens, dtype=np.int32))
    return pa.table(
        {
            "prompt_ids": pa.ListArray.from_arrays(offsets, pa.array(ids.ravel())),
            "output_ids": pa.ListArray.from_arrays(offsets, pa.array(ids[:, ::-1].ravel())),
            "logprobs": pa.ListArray.from_arrays(offsets, pa.array(lps.ravel())),
        }
    )


def as_blobs(t: pa.Table) -> pa.Table:
    return pa.table(
        {
            n: pa.array([c.values.to_numpy().tobytes() for c in t[n].chunk(0)], pa.binary())
            for n in t.column_names
        }
    )


def commit_all(parts: list[pa.Table], ddl: str) -> tuple[list[int], float]:
    """Each part in its own transaction into a fresh file opened as the recorder opens it; the
    WAL bytes each commit added, and the seconds all took."""
    with tempfile.TemporaryDirectory() as tmp:
        con = duckdb.connect()
        con.execute(
            f"ATTACH ? AS w (ROW_GROUP_SIZE {db.ROW_GROUP_SIZE})", [str(Path(tmp) / "x.duckdb")]
        )
        con.execute("USE w")
        con.execute("SET checkpoint_threshold = '1TB'")  # as the recorder: no checkpoint mid-run
        con.execute(f"CREATE TABLE t ({ddl})")
        wal = Path(tmp) / "x.duckdb.wal"
        sizes, last = [], 0
        t0 = time.perf_counter()
        for arrow_rows in parts:  # noqa: B007 (read by DuckDB's replacement scan)
            con.execute("BEGIN TRANSACTION")
            con.execute("INSERT INTO t SELECT * FROM arrow_rows")
            con.execute("COMMIT")
            size = wal.stat().st_size
            sizes.append(size - last)
            last = size
        dt = time.perf_counter() - t0
        con.close()
    return sizes, dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commits", type=int, default=20)
    ap.add_argument("--rows", type=int, default=80, help="rows per commit")
    ap.add_argument("--tokens", type=int, default=256)
    a = ap.parse_args()
    parts = [token_rows(a.rows, a.tokens, seed=i) for i in range(a.commits)]  # own buffers each
    rows = pa.concat_tables(parts).combine_chunks()
    ddl = "prompt_ids INTEGER[], output_ids INTEGER[], logprobs DOUBLE[]"
    small, small_s = commit_all(parts, ddl)
    one, one_s = commit_all([rows], ddl)
    blob, blob_s = commit_all([as_blobs(p) for p in parts], "p BLOB, o BLOB, l BLOB")
    arrow = rows.nbytes
    print(f"duckdb {duckdb.__version__}, {a.commits} commits of {a.rows} rows, {arrow} Arrow bytes")
    print(
        json.dumps(
            {
                "wal_per_arrow_byte_small_commits": round(sum(small) / arrow, 2),
                "wal_per_arrow_byte_one_commit": round(sum(one) / arrow, 2),
                "wal_per_arrow_byte_blob_small_commits": round(sum(blob) / arrow, 2),
                "last_commit_wal_vs_first": round(small[-1] / small[0], 2),
                "small_commits_s": round(small_s, 3),
                "one_commit_s": round(one_s, 3),
                "blob_small_commits_s": round(blob_s, 3),
            }
        )
    )


if __name__ == "__main__":
    main()

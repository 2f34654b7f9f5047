"""Which event ids a run's log may already hold: the recorder's pre-filter for its de-dup, the
64-bit hashes of every id in the file (8 bytes per event). No false negatives; a false positive
costs one lookup in ``_events``, which stays the only truth.
Design: docs/concepts/events.md#the-recorder
"""

from __future__ import annotations

import duckdb
import numpy as np
import numpy.typing as npt
import pyarrow as pa

Hashes = npt.NDArray[np.uint64]


class SeenIds:
    """Hashes of the event ids a log holds (or is about to)."""

    def __init__(self, con: duckdb.DuckDBPyConnection):
        """Seed from the ``_events`` of `con` (the writer's connection)."""
        # the same hash() as the file's, off the writer's connection
        self._hasher = duckdb.connect()
        self._hasher.execute("SET threads = 1")
        seeded = con.execute(
            "SELECT hash(event_id) AS h FROM _events WHERE event_id IS NOT NULL"
        ).fetchnumpy()["h"]
        self._sorted: Hashes = np.unique(np.asarray(seeded, dtype=np.uint64))
        self._recent: set[int] = set()

    def __len__(self) -> int:
        return len(self._sorted) + len(self._recent)

    def hashes(self, ids: list[str]) -> Hashes:
        arrow_rows = pa.table({"event_id": pa.array(ids, pa.string())})  # noqa: F841 (read by DuckDB)
        out = self._hasher.execute("SELECT hash(event_id) AS h FROM arrow_rows").fetchnumpy()["h"]
        return np.asarray(out, dtype=np.uint64)

    def maybe_seen(self, hashes: Hashes) -> npt.NDArray[np.bool_]:
        """Per hash: True if an id of that hash may be in the log (then look it up)."""
        hit = np.zeros(len(hashes), dtype=bool)
        if len(self._sorted):
            at = np.searchsorted(self._sorted, hashes).clip(max=len(self._sorted) - 1)
            hit = self._sorted[at] == hashes
        if self._recent:
            hit |= np.fromiter(
                (int(h) in self._recent for h in hashes), dtype=bool, count=len(hashes)
            )
        return hit

    def add(self, hashes: Hashes) -> None:
        self._recent.update(hashes.tolist())
        if len(self._recent) > max(65_536, len(self._sorted) // 8):
            # merge: both parts sorted, so the stable sort (timsort on two runs) is linear
            new = np.fromiter(self._recent, dtype=np.uint64, count=len(self._recent))
            new.sort()
            self._sorted = np.sort(np.concatenate([self._sorted, new]), kind="stable")
            self._recent.clear()

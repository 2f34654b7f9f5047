"""Who holds which keys in the in-process engine's KV cache: prefix reuse, group sharing,
admission and eviction (host-side bookkeeping; the tensors are kv_cache.py's).

`SlotKV` ("slots") gives a request one row; `PagedKV` ("paged") a table of shared copy-on-write
blocks, admitting only what fits and preempting the youngest row rather than running out of
memory. Keys computed before `invalidate` (a key-changing weight load, a flush) are never reused.
Design: docs/engine.md#the-kv-cache-prefix-reuse-grpo-groups-the-paged-pool
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from stacx.errors import EngineError
from stacx.inference.kv_cache import KVCache, PagedKVCache

if TYPE_CHECKING:
    from stacx.inference.decoder import Decoder

MIN_PREFIX_REUSE = 16  # shorter shared prefixes are recomputed
# slots: free rows kept for their cached prefixes before the least recently used one is reused,
# where the cache would grow for a new row (CPU); a row the cache already holds (CUDA: all of
# them) is always taken before a cached prefix is dropped
KEEP_CACHED_ROWS = 4


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """Length of the common prefix of `a` and `b`, at most `limit`. Compares slices of growing
    size (in C), so the cost follows the common part, not the lists' lengths."""
    n = min(len(a), len(b), limit)
    if n <= 0 or a[0] != b[0]:
        return 0
    lo, step = 0, 64
    while lo < n:
        hi = min(lo + step, n)
        if a[lo:hi] != b[lo:hi]:
            while hi - lo > 1:  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
                mid = (lo + hi) // 2
                if a[lo:mid] == b[lo:mid]:
                    lo = mid
                else:
                    hi = mid
            return lo
        lo, step = hi, min(step * 2, 4096)
    return n


@dataclass
class Place:
    """Where an admitted request's keys go: its row, how many leading tokens it reuses, and
    the row admitted in this same step whose prefill must run first (None: none)."""

    row: int
    reuse: int
    after: int | None = None
    copies: list[tuple[int, int, int]] = field(default_factory=list)  # see KVPlan.copy


class KVPlan:
    """The interface the engine drives; ``tokens[row]``: the tokens whose keys `row` holds."""

    cache: KVCache

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self.tokens: list[list[int]] = []
        self.live: list[bool] = []  # held by a request
        self.row_epoch: list[int] = []
        self.epoch = 0
        self.tick = 0  # LRU clock
        self.pending: dict[int, int | None] = {}  # rows placed in this step -> their `after`

    def _sources(self, tokens: list[int]) -> tuple[int, int]:
        """(row, n) of the live or pending row sharing the longest prefix (n 0: none)."""
        best, best_n = -1, 0
        for row, ok in enumerate(self.live):
            if ok and self.row_epoch[row] == self.epoch and self.pending.get(row) is None:
                n = common_prefix(self.tokens[row], tokens, len(tokens) - 1)
                if n > best_n:
                    best, best_n = row, n
        return best, best_n

    def _add_row(self) -> int:
        self.tokens.append([])
        self.live.append(False)
        self.row_epoch.append(self.epoch)
        return len(self.tokens) - 1

    def place(self, tokens: list[int], cached: int, upcoming: list[list[int]]) -> Place | None:
        """Take a row for a request whose keys will be `tokens[:cached]` after its prefill
        (None: no room now). `upcoming`: prompts waiting behind it (their cached prefixes are
        evicted last)."""
        raise NotImplementedError

    def placed(self, place: Place, tokens: list[int], cached: int) -> None:
        self.pending[place.row] = place.after
        self.live[place.row] = True
        self.tokens[place.row] = tokens[:cached]
        self.row_epoch[place.row] = self.epoch

    def end_step(self) -> None:
        """The step's admissions have been prefilled: its rows become ordinary sources."""
        self.pending.clear()

    def release(self, row: int, keep: bool) -> None:
        """`row`'s request is done (``keep``: its keys stay as a cached prefix)."""
        self.live[row] = False
        self.tick += 1
        if not keep or self.row_epoch[row] != self.epoch:
            self.tokens[row] = []

    def too_long(self, tokens: int) -> str | None:
        """Why a sequence of `tokens` positions can never be cached (None: it can)."""
        return None

    def first(self, prompts: list[list[int]]) -> list[int]:
        """The order in which to admit these waiting prompts (indices; default: as they came)."""
        return list(range(len(prompts)))

    def usage(self) -> dict[str, int]:
        """Positions held (``pool_tokens``), in use (``used_tokens``), held by running rows at the
        peak since `reset_peak` (``peak_tokens``), bytes allocated and bytes per position."""
        return {
            "pool_tokens": 0,
            "used_tokens": 0,
            "peak_tokens": 0,
            "bytes": self.cache.nbytes(),
            "token_bytes": self.cache.token_bytes(),
        }

    def reset_peak(self) -> None:
        """Start a new peak of `usage`."""

    def reserve(self, row: int, upto: int) -> bool:
        """Room for `row`'s positions ``[0, upto)`` (False: none; the caller preempts)."""
        return True

    def invalidate(self) -> None:
        """Keys computed so far are never reused (a weight load that changes them, a flush)."""
        self.epoch += 1
        for row, ok in enumerate(self.live):
            if not ok:
                self.release(row, keep=False)

    def copy(self, copies: list[tuple[int, int, int]]) -> None:
        """Run a placement's prefix copies (before its prefill)."""


class SlotKV(KVPlan):
    """One cache row per request (see the module docstring); the slot cache grows on CPU."""

    def __init__(self, cache: KVCache, max_rows: int) -> None:
        super().__init__(max_rows)
        self.cache = cache
        self.used: list[int] = []  # LRU tick per row

    def _add_row(self) -> int:
        self.used.append(0)
        return super()._add_row()

    def place(self, tokens: list[int], cached: int, upcoming: list[list[int]]) -> Place | None:
        free = [i for i, ok in enumerate(self.live) if not ok]
        best, best_n = -1, 0
        for i in free:  # a cached prefix: take its row, nothing to copy
            if self.tokens[i] and self.row_epoch[i] == self.epoch:
                n = common_prefix(self.tokens[i], tokens, len(tokens) - 1)
                if n > best_n:
                    best, best_n = i, n
        src, src_n = self._sources(tokens)
        if best_n >= MIN_PREFIX_REUSE and best_n >= src_n:
            place = Place(best, best_n)
        else:
            row = self._free_row(free, upcoming)
            if src_n >= MIN_PREFIX_REUSE:  # a running row or a sibling: copy its prefix
                place = Place(row, src_n, src if src in self.pending else None, [(src, row, src_n)])
            else:
                place = Place(row, 0)
        self.placed(place, tokens, cached)
        self.used[place.row] = self.tick
        return place

    def _free_row(self, free: list[int], upcoming: list[list[int]]) -> int:
        """An empty row (the lowest: keeps the decode batch compact), else a new row while the
        table may grow (every cached prefix kept: an unrelated call, a condenser's or a judge's,
        must not take the row an agent's next turn extends), else the least recently used cached
        prefix that no upcoming prompt starts with, else the least recently used."""
        empty = [i for i in free if not self.tokens[i]]
        if empty:
            return empty[0]
        rows = len(self.live)
        if not free or (
            rows < self.max_rows and (rows < self.cache.slots or len(free) < KEEP_CACHED_ROWS)
        ):
            return self._add_row()

        def wanted(i: int) -> bool:
            return any(
                common_prefix(self.tokens[i], p, MIN_PREFIX_REUSE) >= MIN_PREFIX_REUSE
                for p in upcoming
            )

        by_age = sorted(free, key=lambda i: self.used[i])
        return next((i for i in by_age if not wanted(i)), by_age[0])

    def copy(self, copies: list[tuple[int, int, int]]) -> None:
        for src, dst, n in copies:
            self.cache.copy_prefix(src, dst, n)

    def release(self, row: int, keep: bool) -> None:
        super().release(row, keep)
        self.used[row] = self.tick

    def first(self, prompts: list[list[int]]) -> list[int]:
        """Prompts that extend a cached prefix first (stable): admitted after another request,
        they could find their row handed to it (more episodes than rows)."""
        keys = {
            tuple(self.tokens[i][:MIN_PREFIX_REUSE])
            for i, ok in enumerate(self.live)
            if not ok
            and len(self.tokens[i]) >= MIN_PREFIX_REUSE
            and self.row_epoch[i] == self.epoch
        }
        if not keys:
            return list(range(len(prompts)))
        return sorted(
            range(len(prompts)), key=lambda i: tuple(prompts[i][:MIN_PREFIX_REUSE]) not in keys
        )

    def usage(self) -> dict[str, int]:
        held = self.cache.slots * max(self.cache.capacity - 1, 0)  # a slot holds max_len whatever
        return {
            "pool_tokens": held,
            "used_tokens": held,
            "peak_tokens": held,
            "bytes": self.cache.nbytes(),
            "token_bytes": self.cache.token_bytes(),
        }


@dataclass
class Entry:
    """A cached prefix of the paged pool: the tokens whose keys its blocks hold."""

    tokens: list[int]
    blocks: list[int]


class PagedKV(KVPlan):
    """Rows read a pool of blocks through tables (see the module docstring)."""

    def __init__(self, cache: PagedKVCache, max_rows: int) -> None:
        super().__init__(max_rows)
        self.cache = self.pool = cache
        self.block = cache.block
        self.refs = [0] * cache.blocks
        self.free = list(range(cache.blocks - 1, 0, -1))  # block 0: the scratch block
        self.blocks: list[list[int]] = []
        self.entries: collections.OrderedDict[int, Entry] = collections.OrderedDict()  # LRU first
        self._next_entry = 0
        self.row_refs = [0] * cache.blocks  # references from running rows
        self.held = self.peak = 0  # blocks running rows reference, now and at the peak
        for _ in range(max_rows):
            self._add_row()

    def _add_row(self) -> int:
        self.blocks.append([])
        return super()._add_row()

    @property
    def used_blocks(self) -> int:
        return self.pool.blocks - 1 - len(self.free)

    def _blocks_for(self, positions: int) -> int:
        return -(-positions // self.block)

    def _unref(self, blocks: list[int]) -> None:
        for b in blocks:
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.free.append(b)

    def _take(self, n: int, spare: int = 0) -> list[int] | None:
        """`n` fresh blocks, evicting cached prefixes (least recently used first) as needed;
        None unless `spare` more would be left."""
        while len(self.free) < n + spare and self.entries:
            _, entry = self.entries.popitem(last=False)
            self._unref(entry.blocks)
        if len(self.free) < n + spare:
            return None
        got = [self.free.pop() for _ in range(n)]
        for b in got:
            self.refs[b] = 1
        return got

    def _hold(self, blocks: list[int], by: int) -> None:
        """Count running rows' references (`usage`: the blocks running rows need)."""
        for b in blocks:
            self.row_refs[b] += by
            self.held += (self.row_refs[b] == 1) if by > 0 else -(self.row_refs[b] == 0)
        self.peak = max(self.peak, self.held)

    def place(self, tokens: list[int], cached: int, upcoming: list[list[int]]) -> Place | None:
        row = next(i for i, ok in enumerate(self.live) if not ok)  # the engine caps live rows
        src, n = self._sources(tokens)
        key, entry_n = None, 0
        for k, e in self.entries.items():
            m = common_prefix(e.tokens, tokens, len(tokens) - 1)
            if m > entry_n:
                key, entry_n = k, m
        after = None
        if entry_n >= max(n, MIN_PREFIX_REUSE):
            assert key is not None
            shared, n = self.entries[key].blocks, entry_n
        elif n >= MIN_PREFIX_REUSE:
            shared, after = self.blocks[src], src if src in self.pending else None
        else:
            shared, n = [], 0
        keep = shared[: self._blocks_for(n)]
        for b in keep:
            self.refs[b] += 1  # pinned before any eviction below
        if key is not None and entry_n == n and n == len(self.entries[key].tokens):
            self._unref(self.entries.pop(key).blocks)  # superseded: this row extends all of it
        copies: list[tuple[int, int, int]] = []
        if n % self.block and self.refs[keep[-1]] > 1:  # copy-on-write of the partial block
            got = self._take(1)
            if got is None:
                self._unref(keep)
                return None
            self._unref(keep[-1:])
            copies.append((keep[-1], got[0], 0))
            keep = keep[:-1] + got
        # one block to spare per running row: a request readmitted right after its preemption
        # would otherwise take the blocks the others need to go on (no step would run)
        fresh = self._take(self._blocks_for(len(tokens)) - len(keep), spare=sum(self.live))
        if fresh is None:
            self._unref(keep)
            return None
        self.blocks[row] = keep + fresh
        self._hold(self.blocks[row], 1)
        self.pool.set_row(row, self.blocks[row])
        place = Place(row, n, after, copies)
        self.placed(place, tokens, cached)
        return place

    def copy(self, copies: list[tuple[int, int, int]]) -> None:
        for src, dst, _ in copies:
            self.pool.copy_block(src, dst)

    def too_long(self, tokens: int) -> str | None:
        pool = (self.pool.blocks - 1) * self.block
        if self._blocks_for(tokens) * self.block <= pool:
            return None
        return f"{tokens} positions do not fit the paged KV cache's {pool} (raise kv_tokens)"

    def reserve(self, row: int, upto: int) -> bool:
        need = self._blocks_for(min(upto, self.pool.max_len)) - len(self.blocks[row])
        if need <= 0:
            return True
        got = self._take(need)
        if got is None:
            return False
        self.blocks[row] += got
        self._hold(got, 1)
        self.pool.set_row(row, self.blocks[row])
        return True

    def release(self, row: int, keep: bool) -> None:
        blocks, self.blocks[row] = self.blocks[row], []
        self._hold(blocks, -1)
        self.pool.set_row(row, [])
        held = self._blocks_for(len(self.tokens[row]))
        if keep and self.row_epoch[row] == self.epoch and len(self.tokens[row]) >= MIN_PREFIX_REUSE:
            self.entries[self._next_entry] = Entry(self.tokens[row], blocks[:held])
            self._next_entry += 1
            blocks = blocks[held:]
        self._unref(blocks)
        super().release(row, keep=False)

    def usage(self) -> dict[str, int]:
        b = self.block
        return {
            "pool_tokens": (self.pool.blocks - 1) * b,
            "used_tokens": self.used_blocks * b,
            "peak_tokens": self.peak * b,
            "bytes": self.pool.nbytes(),
            "token_bytes": self.pool.token_bytes(),
        }

    def reset_peak(self) -> None:
        self.peak = self.held

    def invalidate(self) -> None:
        super().invalidate()
        while self.entries:
            self._unref(self.entries.popitem()[1].blocks)


KV_CACHE_MODES = ("slots", "paged")


def new_plan(
    decoder: Decoder,
    mode: str,
    rows: int,
    *,
    kv_tokens: int | None = None,
    block: int = 64,
    cache_bytes: int | None = None,
) -> KVPlan:
    """The engine's KV cache and its policy: the ONE place where the cache's size is decided.

    Slots: ``rows`` rows of ``max_len + 1`` positions (grown on demand on CPU); paged:
    ``kv_tokens`` positions (default: what the slots would hold) in blocks of ``block``. On CUDA
    the cache gets at most 80% of the free memory, or the ``cache_bytes`` budget
    (placement.engine_cache_gib; slots lower ``max_rows`` to fit it); a size that does not fit
    is an :class:`EngineError` naming the numbers."""
    if mode not in KV_CACHE_MODES:
        raise EngineError(f"kv_cache must be one of {', '.join(KV_CACHE_MODES)}, got {mode!r}")
    cuda = decoder.device.type == "cuda"
    per_token = 2 * len(decoder.layers) * decoder.n_kv * decoder.head_dim
    per_token *= torch.finfo(decoder.dtype).bits // 8
    free = torch.cuda.mem_get_info(decoder.device)[0] if cuda else 0
    budget = cache_bytes if cuda else None
    if budget is not None:
        rows = _budget_rows(decoder, mode, rows, per_token, budget, kv_tokens)
    full = rows * (decoder.max_len + 1)
    cap = (budget if budget is not None else int(0.8 * free)) // per_token
    if mode == "paged" and kv_tokens is None:
        if budget is not None:  # whole blocks, and the pool allocates one block more
            cap = (cap // max(block, 1) - 1) * block
        tokens = min(full, cap) if cuda else full
    else:
        tokens = kv_tokens if mode == "paged" and kv_tokens is not None else full
    if cuda:
        _check_fits(decoder, mode, rows, tokens, per_token, free, budget is not None)
    if mode == "slots":
        cache = decoder.new_cache()
        if cuda:  # static cache at full size: CUDA graphs need fixed addresses
            cache.grow(rows, decoder.max_len + 1)
        return SlotKV(cache, rows)
    if block < 1 or tokens < block:
        raise EngineError(
            f"a paged KV cache needs kv_block >= 1 and kv_tokens >= kv_block, "
            f"got {block} and {tokens}"
        )
    return PagedKV(decoder.new_paged_cache(rows, -(-tokens // block) + 1, block), rows)


def _check_fits(
    decoder: Decoder, mode: str, rows: int, tokens: int, per_token: int, free: int, budgeted: bool
) -> None:
    """EngineError when `tokens` positions exceed `free` (80% of it without a budget)."""
    if tokens * per_token <= (free if budgeted else 0.8 * free):
        return
    what = (
        f"kv_tokens={tokens}"
        if mode == "paged"
        else f"max_batch={rows} x max_len={decoder.max_len}"
    )
    share = "the" if budgeted else "80% of the"
    raise EngineError(
        f"the KV cache for {what} needs {tokens * per_token / 2**30:.1f} GiB, more than "
        f"{share} {free / 2**30:.1f} GiB free on {decoder.device}; lower it"
    )


def _budget_rows(
    decoder: Decoder, mode: str, rows: int, per_token: int, budget: int, kv_tokens: int | None
) -> int:
    """`new_plan`'s rows under a byte budget: slots keep the full-length rows that fit it (an
    error when none does); a paged pool keeps its rows, and an explicit ``kv_tokens`` must fit."""
    gib = 2**30
    if mode == "paged":
        if kv_tokens is not None and kv_tokens * per_token > budget:
            raise EngineError(
                f"kv_tokens={kv_tokens} needs {kv_tokens * per_token / gib:.2f} GiB, more than the "
                f"KV cache budget of {budget / gib:.2f} GiB (placement.engine_cache_gib)"
            )
        return rows
    per_row = per_token * (decoder.max_len + 1)
    if budget < per_row:
        raise EngineError(
            f"a KV cache budget of {budget / gib:.2f} GiB holds no sequence of "
            f"max_len={decoder.max_len} ({per_row / gib:.2f} GiB each); raise the budget "
            "(placement.engine_cache_gib) or lower max_len"
        )
    return min(rows, budget // per_row)

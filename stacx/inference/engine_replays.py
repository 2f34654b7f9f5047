"""Multi-step decode replays of the torch engine (CUDA graphs only): when to run several steps
in one replay, and the replay launched ahead while the host reads the last one's tokens (a
TorchEngine mixin). A replay is launched ahead only while the batch goes on unchanged (paged: with
its blocks reserved); every token is read before a weight load runs (`_drain`).
Design: docs/engine.md#cuda-graphs
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import TYPE_CHECKING

from stacx.inference.engine_admission import Admission
from stacx.inference.engine_requests import Request, hand_over

if TYPE_CHECKING:
    from stacx.inference.cuda_graphs import Chunk, GraphedDecode
    from stacx.inference.decoder import Decoder
    from stacx.inference.kv_cache import KVCache
    from stacx.inference.kv_plan import KVPlan


class MultiStepReplays(Admission):
    """The engine's multi-step replay scheduling."""

    _graphed: GraphedDecode | None
    _ahead: tuple[list[Request], Chunk] | None
    _owner: list[Request | None]
    _waiting: collections.deque[Request]
    _blocked: bool
    _jobs: collections.deque[Callable[[], None]]
    _kv: KVPlan
    _cache: KVCache
    decoder: Decoder
    decode_steps: int
    max_batch: int
    max_len: int
    vocab_size: int
    stats: dict[str, int]

    def _admissible(self) -> bool:
        """Requests wait that a free row may take now (not while the paged pool refuses them or
        the free rows are held for next turns: the batch then goes on in multi-step replays)."""
        return (
            bool(self._waiting)
            and self._n_active() < self.max_batch
            and not self._blocked
            and not self._held()
        )

    def _take(self, r: Request, tok: int, lp: float) -> bool:
        raise NotImplementedError

    def _chunk_plan(self, live: list[Request]) -> tuple[int, bool]:
        """Steps in one replay (1: the per-step path, for top-p/top-k rows or while admissible
        requests wait), and whether sampled (plain temperature, Triton step only)."""
        if (
            self._graphed is None
            or self.decode_steps == 1
            or any(r.guide is not None for r in live)
        ):
            return 1, False  # (a constrained row's tokens are masked one step at a time)
        sampled = any(r.row.temperature > 0 for r in live)
        if sampled and (
            not self.decoder.kernels or any(r.row.truncated(self.vocab_size) for r in live)
        ):
            return 1, False
        if self._admissible():
            return 1, False
        return self._chunk_steps(live, 0), sampled

    def _chunk_steps(self, reqs: list[Request], ahead: int) -> int:
        """A power of two (few graph shapes), no more than the most tokens any row may still
        produce, nor than the cache has room for, once each row has made `ahead` more."""
        room = self._cache.capacity - 1 - max(r.cached for r in reqs) - ahead
        left = (
            max(
                min(
                    r.params.max_new_tokens - len(r.output),
                    self.max_len - len(r.prompt) - len(r.output),
                )
                for r in reqs
            )
            - ahead
        )
        k = 1
        while k * 2 <= min(self.decode_steps, left, room):
            k *= 2
        return k

    def _run_chunk(self, reqs: list[Request], chunk: Chunk) -> None:
        """Take a launched replay's tokens, first launching its continuation where the batch goes
        on unchanged, so the GPU runs it while this thread reads them."""
        self._ahead = self._continuation(reqs, chunk)
        self._accept_chunk(reqs, chunk)

    def _continuation(
        self, reqs: list[Request], chunk: Chunk
    ) -> tuple[list[Request], Chunk] | None:
        """Launch the chunk after `chunk` before its tokens are read, only while no request, job
        (a weight load must not land between launch and read) or cancel waits; None otherwise.
        Rows that stopped inside `chunk` run on, their extra tokens discarded."""
        assert self._graphed is not None
        if self._admissible() or self._jobs or any(r.cancelled for r in reqs):
            return None
        if [r for r in self._owner if r is not None] != reqs:
            return None  # admitted or finished since `chunk` was planned
        steps = self._chunk_steps(reqs, chunk.steps)  # as if every row ran through `chunk`
        if steps <= 1:
            return None
        last = max(r.cached for r in reqs) + chunk.steps  # the furthest row's next position
        if not all(self._kv.reserve(r.slot, r.cached + chunk.steps + steps) for r in reqs):
            return None  # the paged pool is full: plan on the host (it may preempt)
        nxt = self._graphed.continue_chunk(chunk, last + steps, steps)
        if nxt is None:
            return None
        self.stats["decode_ahead"] += 1
        return reqs, nxt

    def _drain(self) -> None:
        """Take the tokens of a continuation launched ahead, if any."""
        if self._ahead is not None:
            reqs, chunk = self._ahead
            self._ahead = None
            self._accept_chunk(reqs, chunk)

    def _accept_chunk(self, reqs: list[Request], chunk: Chunk) -> None:
        """Take each row's tokens up to its stop; discard the rest (all of a row already done).
        Every replay the GPU ran is counted here, a continuation drained early included."""
        self.stats["decode_steps"] += chunk.steps
        self.stats["decode_calls"] += 1
        tok_K_B, lp_K_B = chunk.read()  # the one device->host transfer of the chunk
        reqs = [r for r in reqs if self._owner[r.slot] is r]
        done: set[int] = set()
        for toks, lps in zip(tok_K_B, lp_K_B, strict=True):
            for r in reqs:
                if r.slot not in done and self._take(r, int(toks[r.slot]), lps[r.slot]):
                    done.add(r.slot)
        hand_over(reqs, self._owner)

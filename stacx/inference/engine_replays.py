"""Multi-step decode replays of the in-process engine (CUDA graphs only): when to run several
decode steps in one graph replay, and the replay launched ahead while the host reads the last
one's tokens (a mixin of :class:`~stacx.inference.torch_engine.TorchEngine`, split out by
concept: it reads the engine's state and hands each token to the engine's `_take`).

Guarantees: a replay is launched ahead only while the batch goes on unchanged (nothing
waits, no job, no cancel) and, with a paged cache, only when the blocks for its positions are
reserved; every token is read before a weight load runs (`_drain`), so each carries the
version that sampled it. Rows that stop inside a replay have their extra tokens discarded.
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
    """The engine's multi-step replay scheduling (see the module docstring)."""

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
        """Requests wait that a free row may take now (not while the paged pool refuses them,
        nor while the free rows are held for next turns: until a row ends, a hold ends or a
        next turn comes, the batch goes on in multi-step replays)."""
        return (
            bool(self._waiting)
            and self._n_active() < self.max_batch
            and not self._blocked
            and not self._held()
        )

    def _take(self, r: Request, tok: int, lp: float) -> bool:
        raise NotImplementedError

    def _chunk_plan(self, live: list[Request]) -> tuple[int, bool]:
        """How many steps to run in one replay (1: the per-step path), and whether sampled.

        Greedy rows, and with the Triton step rows sampled at a plain temperature, run in
        multi-step replays; a row with top-p/top-k truncation takes the per-step path, as do
        all while requests wait that a free row can take (they are admitted between replays). Steps: see
        `_chunk_steps`."""
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
        """Take a launched multi-step replay's tokens; first launch its continuation where the
        batch goes on unchanged, so that the GPU runs it while this thread reads these tokens
        (the host work per chunk, ~3 ms at 64 rows, would otherwise leave the GPU idle)."""
        self.stats["decode_steps"] += chunk.steps
        self.stats["decode_calls"] += 1
        self._ahead = self._continuation(reqs, chunk)
        self._accept_chunk(reqs, chunk)

    def _continuation(
        self, reqs: list[Request], chunk: Chunk
    ) -> tuple[list[Request], Chunk] | None:
        """Launch the chunk after `chunk` over the same rows from the inputs it left on the
        device, before its tokens are read (None: the batch may change, so the next step is
        planned on the host). Rows that stop inside `chunk` go on in the continuation; their
        extra tokens are discarded, like a chunk's tokens after a stop, and the keys they write
        lie past their end. Only while nothing else waits: a new request, a job (a weight load
        must not land between a chunk's launch and the reading of its tokens) or a cancel."""
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
        """Take each row's tokens of a multi-step replay up to its stop; discard the rest (and
        all of a row that had finished before it: a continuation runs rows that stopped)."""
        tok_K_B, lp_K_B = chunk.read()  # the one device->host transfer of the chunk
        reqs = [r for r in reqs if self._owner[r.slot] is r]
        done: set[int] = set()
        for toks, lps in zip(tok_K_B, lp_K_B, strict=True):
            for r in reqs:
                if r.slot not in done and self._take(r, int(toks[r.slot]), lps[r.slot]):
                    done.add(r.slot)
        hand_over(reqs, self._owner)

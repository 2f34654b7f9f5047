"""Admission when requests outnumber the torch engine's rows: an episode's next turn before new
work, and prefill in rounds that keep decode going (host-side policy, no tensors).

A finished request holds its row ``hold_s`` for a next turn (a request extending its whole
prompt); holds stop holding rows back after ``patience`` in a row expire unclaimed. The engine
knows no episodes: prompt extension is the whole test. One prefill is never split across rounds.
Design: docs/engine.md#against-the-bandwidth-bound-admission-when-episodes-outnumber-rows
"""

from __future__ import annotations

import collections
import itertools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stacx.inference.engine_requests import Request

if TYPE_CHECKING:
    from stacx.inference.kv_plan import KVPlan, Place

# contexts admitted per prefill round at most (past the first request): bounds the prefill's
# transient key reads (paged: gathered copies) when hundreds of long contexts arrive at once
ADMIT_TOKENS = 1 << 18


def extends(tokens: list[int], prefix: list[int]) -> bool:
    """Whether `tokens` starts with all of `prefix`; rejects most non-matches in O(1) (two probe
    positions) before the full comparison (prompts sharing a long system prompt differ past it)."""
    n = len(prefix)
    if (
        n == 0
        or len(tokens) < n
        or tokens[n - 1] != prefix[n - 1]
        or tokens[n // 2] != prefix[n // 2]
    ):
        return False
    return tokens[:n] == prefix


@dataclass
class Hold:
    prompt: list[int]
    until: float  # time.monotonic()


class Holds:
    """Rows held for the next turn of the episodes that just finished one."""

    def __init__(self, hold_s: float, patience: int) -> None:
        if hold_s < 0:
            raise ValueError(f"hold_s must be >= 0, got {hold_s}")
        self.hold_s, self.patience = hold_s, patience
        self.held: list[Hold] = []
        self.misses = 0  # holds that expired since the last next turn arrived
        self.version = 0  # bumped when holds are added: waiting requests' order may change

    def __len__(self) -> int:
        """Rows held back from requests that claim none (0 while holds do not pay)."""
        return len(self.held) if self.misses < self.patience else 0

    def release(self, prompt: list[int]) -> None:
        """A request with this prompt finished and kept its keys: hold its row."""
        if self.hold_s > 0:
            self.held.append(Hold(prompt, time.monotonic() + self.hold_s))
            self.version += 1

    def expire(self) -> None:
        now = time.monotonic()
        if self.held and self.held[0].until <= now:
            left = [h for h in self.held if h.until > now]
            self.misses += len(self.held) - len(left)
            self.held = left

    def find(self, tokens: list[int]) -> int | None:
        """The hold of the longest held prompt `tokens` extends, or None."""
        best, best_n = None, 0
        for i, h in enumerate(self.held):
            if len(h.prompt) > best_n and extends(tokens, h.prompt):
                best, best_n = i, len(h.prompt)
        return best

    def seen(self, tokens: list[int]) -> bool:
        """Whether a request of `tokens` is a next turn (it extends a live hold's prompt): then
        holds pay, and hold rows back again if they had stopped."""
        if self.find(tokens) is None:
            return False
        self.misses = 0
        return True

    def claim(self, tokens: list[int]) -> None:
        """End the hold a next turn of `tokens` was admitted for (if it has not expired)."""
        i = self.find(tokens)
        if i is not None:
            del self.held[i]

    def wait_s(self) -> float | None:
        """Seconds until the next hold that holds a row back expires (None: none does); drops
        expired holds first, which would make it 0 and the engine's idle wait a spin."""
        self.expire()
        return max(self.held[0].until - time.monotonic(), 0.0) if len(self) else None

    def prompts(self) -> list[list[int]]:
        return [h.prompt for h in self.held]


class Admission:
    """What the engine admits next (a TorchEngine mixin over its queue, rows and KV plan)."""

    _waiting: collections.deque[Request]
    _owner: list[Request | None]
    _kv: KVPlan
    _holds: Holds
    _held_back: bool  # every free row is held and the head of the queue claims none
    _blocked: bool
    _submits: int
    _order_key: tuple[int, int, int] | None
    max_batch: int
    prefill_tokens: int

    def _n_active(self) -> int:
        return sum(r is not None for r in self._owner)

    def _held(self) -> bool:
        """The head of the queue waits for a held row, still."""
        if self._held_back:
            self._holds.expire()
            self._held_back = self._n_active() + len(self._holds) >= self.max_batch
        return self._held_back

    def _order_waiting(self) -> None:
        """Next turns first, then the KV plan's `first`, else as they came (stable); redone only
        after a submission, a release or a new hold. Each request meets the holds once."""
        key = (self._submits, self._kv.tick, self._holds.version)
        if key == self._order_key:
            return
        self._order_key = key
        waiting = list(self._waiting)
        for r in waiting:
            if r.next_turn is None:
                r.next_turn = self._holds.seen(r.prompt)
        order = self._kv.first([r.prompt for r in waiting])
        self._waiting = collections.deque(
            sorted((waiting[i] for i in order), key=lambda r: not r.next_turn)
        )

    def _take_waiting(self) -> list[tuple[Request, Place]]:
        """Rows for the head of the queue (caller holds ``_cv``) until rows, pool, ADMIT_TOKENS or
        ``prefill_tokens`` (past the first) run out, or every free row is held for another."""
        batch: list[tuple[Request, Place]] = []
        self._holds.expire()
        context = new = 0  # a prefill reads each row's keys (paged: a copy)
        while self._waiting and self._n_active() < self.max_batch and context < ADMIT_TOKENS:
            req = self._waiting[0]
            if req.cancelled or req.future.done():
                self._waiting.popleft()
                continue
            if new >= self.prefill_tokens:
                break  # the rest after a decode step
            if req.next_turn is None:
                req.next_turn = self._holds.seen(req.prompt)
            if not req.next_turn and self._n_active() + len(self._holds) >= self.max_batch:
                self._held_back = True  # until a hold ends or a next turn comes
                break
            upcoming = [r.prompt for r in itertools.islice(self._waiting, 1, self.max_batch)]
            place = self._kv.place(
                req.prompt + req.output, req.cached, upcoming + self._holds.prompts()
            )
            if place is None:  # the paged pool is full: wait for a row to end (admission control)
                self._blocked = True
                break
            self._waiting.popleft()
            if req.next_turn:
                self._holds.claim(req.prompt)
            context += len(req.prompt) + len(req.output)
            new += len(req.prompt) + len(req.output) - place.reuse
            req.slot, req.admitted = place.row, req.admitted or time.monotonic()
            self._owner += [None] * (len(self._kv.tokens) - len(self._owner))
            self._owner[place.row] = req
            batch.append((req, place))
        return batch

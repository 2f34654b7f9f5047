"""One lock per process for CUDA work that must not run beside another thread's: a CUDA graph
capture (engine) and a train step (trainer) of one process and GPU. During a capture, another
thread's random op or device-wide work breaks it, and a failed capture leaves the default generator
in capture mode for good ("Offset increment outside graph capture"). Decode replays do not take it;
separate processes need none.
Design: docs/concepts/placement.md#engine-and-trainer-on-one-gpu
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class DeviceLock:
    """A mutex in which a waiting capture goes before a waiting train step (a trainer stepping back
    to back would otherwise starve the engine's capture, and its decoding)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = False
        self._captures_waiting = 0

    def capture(self) -> AbstractContextManager[None]:
        return self._held(capture=True)

    def step(self) -> AbstractContextManager[None]:
        return self._held(capture=False)

    @contextmanager
    def _held(self, *, capture: bool) -> Iterator[None]:
        with self._cond:
            self._captures_waiting += capture
            self._cond.wait_for(lambda: not self._busy and (capture or not self._captures_waiting))
            self._captures_waiting -= capture
            self._busy = True
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()


CUDA_EXCLUSIVE = DeviceLock()


def exclusive(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """``fn(*args, **kwargs)`` as a train step under :data:`CUDA_EXCLUSIVE` (for ``to_thread``)."""
    with CUDA_EXCLUSIVE.step():
        return fn(*args, **kwargs)

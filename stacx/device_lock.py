"""One lock per process for CUDA work that must not run beside another thread's CUDA work.

Why: a CUDA graph capture registers the process's default CUDA generator with the graph. While
a capture is under way, a random op of another thread on that generator raises "Offset
increment outside graph capture", and device-wide work of another thread (torch.compile's
autotuning, an allocator release, a synchronize) can invalidate the capture; a capture that
fails leaves the default generator in capture mode, and from then on every random op of the
process fails the same way (the README's colocated GPU runs lost every later engine step to it).

When the engine and the trainer share a process and a GPU (``placement.mode = "local"`` on one
device), the engine holds this lock while it captures a graph, and the trainer while it builds,
steps and saves. Decode replays and sampling do not take it, so the engine keeps decoding while
the trainer steps. Captures happen once per new (batch, length) bucket: the cost is a capture
waiting for the end of a train step, or a step waiting for a capture (well under a second).
Processes do not share generators, so Ray placement needs no lock and pays nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class DeviceLock:
    """A mutex in which a waiting capture goes before a waiting train step: a trainer stepping
    back to back would otherwise re-take a plain lock before the engine's thread wakes, and the
    engine would wait for its capture (and so stop decoding) for many steps."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = False
        self._captures_waiting = 0

    @contextmanager
    def capture(self) -> Iterator[None]:
        with self._cond:
            self._captures_waiting += 1
            self._cond.wait_for(lambda: not self._busy)
            self._captures_waiting -= 1
            self._busy = True
        try:
            yield
        finally:
            self._release()

    @contextmanager
    def step(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._busy and not self._captures_waiting)
            self._busy = True
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        with self._cond:
            self._busy = False
            self._cond.notify_all()


CUDA_EXCLUSIVE = DeviceLock()


def exclusive(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """``fn(*args, **kwargs)`` as a train step under :data:`CUDA_EXCLUSIVE` (for
    ``asyncio.to_thread``): it waits for a capture under way or waiting."""
    with CUDA_EXCLUSIVE.step():
        return fn(*args, **kwargs)

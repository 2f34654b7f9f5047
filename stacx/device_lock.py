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
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

CUDA_EXCLUSIVE = threading.Lock()


def exclusive(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """``fn(*args, **kwargs)`` under :data:`CUDA_EXCLUSIVE` (for ``asyncio.to_thread``)."""
    with CUDA_EXCLUSIVE:
        return fn(*args, **kwargs)

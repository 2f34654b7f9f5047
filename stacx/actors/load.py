"""Each process's load as data, published as ``ProcessLoad`` every window: event-loop lag (how late
a ``TICK_S`` sleep wakes), CPU share (this process's threads, not its children), resident memory and
forks (``os.fork``, a subprocess with ``preexec_fn``: the calls that copy the process). A window
whose lag p99 passes ``SATURATED_MS`` is logged as a warning. Limits: stalls shorter than a tick are
seen only when a tick lands in them; the CPU share counts every thread, not the loop's.
Design: docs/concepts/placement.md#processes-one-node-many-processes
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import time

from stacx.events import Emit, ProcessLoad

log = logging.getLogger(__name__)

TICK_S = 0.05
_forks = 0


def _count_fork() -> None:
    global _forks
    _forks += 1


os.register_at_fork(before=_count_fork)


def forks() -> int:
    """The Python-level forks of this process so far (os.fork, subprocess with preexec_fn)."""
    return _forks


WINDOW_S = 5.0
SATURATED_MS = 100.0


def _percentile(sorted_ms: list[float], q: float) -> float:
    if not sorted_ms:
        return 0.0
    return sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))]


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:  # not Linux: the peak instead
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class ProcessLoadWatch:
    """Publishes this process's ``ProcessLoad`` every ``window_s`` until stopped, and at stop."""

    def __init__(
        self, emit: Emit, run_id: str, process: str, *, window_s: float = WINDOW_S
    ) -> None:
        self.emit, self.run_id, self.process, self.window_s = emit, run_id, process, window_s
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    def start(self) -> None:
        """Start watching (a second call does nothing)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"load:{self.process}")

    async def stop(self) -> None:
        if self._task is None:
            return
        self._stopping.set()
        with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
            await asyncio.wait_for(self._task, timeout=5.0)
        self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            lags: list[float] = []
            t0, cpu0, forks0 = time.monotonic(), _cpu_s(), forks()
            while time.monotonic() - t0 < self.window_s and not self._stopping.is_set():
                t = loop.time()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), TICK_S)
                lags.append(max(0.0, (loop.time() - t - TICK_S) * 1e3))
            await self._publish(lags, time.monotonic() - t0, _cpu_s() - cpu0, forks() - forks0)

    async def _publish(self, lags: list[float], wall_s: float, cpu_s: float, n_forks: int) -> None:
        if wall_s <= 0 or not lags:
            return
        lags.sort()
        event = ProcessLoad(
            run_id=self.run_id,
            process=self.process,
            pid=os.getpid(),
            window_s=wall_s,
            lag_p50_ms=_percentile(lags, 0.5),
            lag_p99_ms=_percentile(lags, 0.99),
            lag_max_ms=lags[-1],
            cpu_share=cpu_s / wall_s,
            rss_mb=_rss_mb(),
            forks=n_forks,
        )
        if event.lag_p99_ms > SATURATED_MS:
            log.warning(
                "process %s (pid %d) is saturated: event-loop lag p99 %.0f ms over %.1f s "
                "(CPU %.2f cores)",
                self.process,
                event.pid,
                event.lag_p99_ms,
                wall_s,
                event.cpu_share,
            )
        try:
            await self.emit(event)
        except Exception as e:  # the bus is going away at shutdown: load is not worth a crash
            log.debug("process load of %s not published: %r", self.process, e)


def _cpu_s() -> float:
    """This process's CPU seconds, threads included, children not (a child's whole life would land
    in the window that reaps it)."""
    return sum(os.times()[:2])

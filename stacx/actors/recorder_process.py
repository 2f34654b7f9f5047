"""Run a recorder as its own process: `python -m stacx.actors.recorder_process URL RUN_ID RUN_DIR`.

Only the kill -9 tests use it (a recorder that can be killed without killing the test):
``stacx run`` always records in-process, in its RunContext (``stacx.actors.run``), and so
does the events bench (``tools/bench/events.py``). With ``--until-seq N`` it exits 0 once everything up to stream
sequence N is committed, with ``--until-events N`` once this process has recorded N events
(publishers batch events, so a count of events does not give the last sequence); otherwise it
runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import time
from pathlib import Path

from stacx.bus.client import connect, ensure_stream, stream_replicas
from stacx.store.recorder import Recorder


async def main_async(
    url: str,
    run_id: str,
    run_dir: Path,
    until_seq: int | None,
    report: bool,
    until_events: int | None = None,
) -> None:
    nc = await connect(url, name=f"stacx-recorder-{run_id}")
    js = nc.jetstream(timeout=10.0)
    await ensure_stream(js, run_id, replicas=stream_replicas(nc))

    def on_commit(seq: int) -> None:
        if report:  # one line per commit: "<seq> <unix time>", for benchmarks
            print(seq, repr(time.time()), flush=True)
        if until_events is not None and rec.recorded >= until_events:
            rec.stop()

    rec = Recorder(js, run_id, run_dir, on_commit=on_commit)
    rec.open()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, rec.stop)
    task = asyncio.create_task(rec.run())
    if until_seq is not None:
        await rec.wait_for(until_seq)
        rec.stop()
    await task
    rec.close()
    with contextlib.suppress(Exception):
        await nc.drain()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("url")
    p.add_argument("run_id")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--until-seq", type=int, default=None)
    p.add_argument("--until-events", type=int, default=None)
    p.add_argument("--report", action="store_true", help="print '<seq> <time>' after each commit")
    a = p.parse_args()
    asyncio.run(main_async(a.url, a.run_id, a.run_dir, a.until_seq, a.report, a.until_events))


if __name__ == "__main__":
    main()

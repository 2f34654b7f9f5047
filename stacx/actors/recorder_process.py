"""Run a recorder as its own process: `python -m stacx.actors.recorder_process URL RUN_ID RUN_DIR`.

For the kill -9 tests only (``stacx run`` records in its RunContext). ``--until-seq N``: exit 0 once
stream sequence N is committed; ``--until-events N``: once this process recorded N events; else run
until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time
from pathlib import Path

from stacx.bus.client import connect, drain_or_close, ensure_stream, stream_replicas
from stacx.store.recorder import Recorder


async def main_async(a: argparse.Namespace) -> None:
    nc = await connect(a.url, name=f"stacx-recorder-{a.run_id}")
    js = nc.jetstream(timeout=10.0)
    await ensure_stream(js, a.run_id, replicas=stream_replicas(nc))

    def on_commit(seq: int) -> None:
        if a.report:  # one line per commit: "<seq> <unix time>", for benchmarks
            print(seq, repr(time.time()), flush=True)
        if a.until_events is not None and rec.recorded >= a.until_events:
            rec.stop()

    rec = Recorder(js, a.run_id, a.run_dir, on_commit=on_commit)
    rec.open()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, rec.stop)
    task = asyncio.create_task(rec.run())
    if a.until_seq is not None:
        await rec.wait_for(a.until_seq)
        rec.stop()
    await task
    rec.close()
    await drain_or_close(nc)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("url")
    p.add_argument("run_id")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--until-seq", type=int, default=None)
    p.add_argument("--until-events", type=int, default=None)
    p.add_argument("--report", action="store_true", help="print '<seq> <time>' after each commit")
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()

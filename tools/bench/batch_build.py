"""Train batch build time: a real DuckDB run log -> the trainer's samples -> packed tensors.

Writes ``--episodes`` scored GRPO episodes of ``--turns`` turns each into a fresh run database
(the recorder's Arrow path, `stacx.store.schema.to_arrow`; turns stored linearly as the agents
emit them: each turn's new prompt ids after ``prefix_len``), then times what the trainer does
for one step on all of them, on the CPU:

- ``read_ms``: ``stacx.train.trainer.step_batch`` (the source view's rows, the stored chains,
  the samples: one packed sequence per episode with ``pack_episodes``), through DuckDB;
- ``pack_ms``: ``stacx.train.packing.pack`` of those samples into rows of ``--row-tokens``;
- ``build_ms`` = the two (the median of ``--repeats``).

Run it on two trees to compare (the tree first on ``PYTHONPATH`` is the one measured):

    PYTHONPATH=. python tools/bench/batch_build.py [--episodes 64] [--turns 10]

Prints the machine and versions to stderr, then ONE JSON line last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from stacx import events as ev
from stacx.store.db import open_writer
from stacx.store.schema import TABLES, to_arrow
from stacx.train.config import TrainerConfig
from stacx.train.packing import pack
from stacx.train.trainer import step_batch


def episode_events(
    rng: random.Random, eid: str, group: str, index: int, turns: int, first: int, obs: int, out: int
) -> list[ev.Event]:
    """One scored episode: whole prompts that extend the previous prompt + output."""
    events: list[ev.Event] = [
        ev.EpisodeStarted(
            run_id="r", episode_id=eid, task_id=group, group_id=group, sample_index=index
        )
    ]
    prompt = [rng.randrange(1, 50_000) for _ in range(first)]
    end: list[int] = []
    for t in range(turns):
        output = [rng.randrange(1, 50_000) for _ in range(out)]
        prefix_len, new = ev.prompt_split(prompt, end)
        events.append(
            ev.TurnGenerated(
                run_id="r",
                episode_id=eid,
                turn=t,
                prompt_ids=new,
                prefix_len=prefix_len,
                output_ids=output,
                logprobs=[-0.5] * out,
                weight_version=0,
            )
        )
        end = prompt + output
        prompt = end + [rng.randrange(1, 50_000) for _ in range(obs)]
    events += [
        ev.EpisodeFinished(run_id="r", episode_id=eid, stop_reason="submitted", n_turns=turns),
        ev.RewardAssigned(run_id="r", episode_id=eid, reward=float(index % 2)),
    ]
    return events


def write(con: object, events: list[ev.Event]) -> None:
    by_kind: dict[str, list[ev.Event]] = {}
    for e in events:
        by_kind.setdefault(e.kind, []).append(e)
    seq = 0
    for kind, items in by_kind.items():
        batch = to_arrow(kind, items, list(range(seq + 1, seq + 1 + len(items))))
        seq += len(items)
        con.register("_batch", batch)  # type: ignore[attr-defined]
        con.execute(f'INSERT INTO "{TABLES[kind].name}" SELECT * FROM _batch')  # type: ignore[attr-defined]
        con.unregister("_batch")  # type: ignore[attr-defined]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--first", type=int, default=512, help="first prompt's ids")
    p.add_argument("--obs", type=int, default=128, help="observation ids per turn")
    p.add_argument("--out", type=int, default=64, help="output ids per turn")
    p.add_argument("--group", type=int, default=8, help="episodes per GRPO group")
    p.add_argument("--row-tokens", type=int, default=16384)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-pack-episodes", action="store_true", help="one sample per turn")
    args = p.parse_args()
    rng = random.Random(0)
    events: list[ev.Event] = []
    ids = []
    for i in range(args.episodes):
        group = f"g{i // args.group}"
        if i % args.group == 0:
            events.append(
                ev.TaskScheduled(
                    run_id="r", task_id=group, task_path="/x", group_id=group, n_samples=args.group
                )
            )
        eid = f"e{i:04d}"
        ids.append(eid)
        events += episode_events(
            rng, eid, group, i % args.group, args.turns, args.first, args.obs, args.out
        )
    cfg = TrainerConfig(algorithm="grpo", pack_episodes=not args.no_pack_episodes)
    with tempfile.TemporaryDirectory() as tmp:
        con = open_writer(Path(tmp) / "run")
        write(con, events)

        async def query(sql: str, params: dict[str, object]) -> pa.Table:
            return con.sql(sql, params=params).to_arrow_table()

        async def measure() -> tuple[list[float], list[float], dict[str, int]]:
            # one event loop for every repeat: asyncio.run's SIGINT handling reprs its task
            # (and so the returned batch), which would be timed as well
            reads, packs, shape = [], [], {}
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                batch = await step_batch(cfg, query, ids)
                t1 = time.perf_counter()
                row = max(args.row_tokens, max(s.n_positions for s in batch.samples))
                packed = pack(batch.samples, row)
                t2 = time.perf_counter()
                reads.append((t1 - t0) * 1e3)
                packs.append((t2 - t1) * 1e3)
                shape = {
                    "rows": batch.n_rows,
                    "sequences": len(batch.samples),
                    "positions": packed.n_tokens,
                    "loss_tokens": packed.n_loss_tokens,
                }
            return reads, packs, shape

        reads, packs, shape = asyncio.run(measure())
        con.close()
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=os.getcwd(),
            check=False,
        ).stdout.strip()
    except OSError:
        commit = ""
    print(
        f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, python "
        f"{platform.python_version()}, tree {os.getcwd()} @ {commit}",
        file=sys.stderr,
    )
    read, packed_ms = statistics.median(reads), statistics.median(packs)
    print(
        json.dumps(
            {
                "bench": "batch_build",
                "episodes": args.episodes,
                "turns": args.turns,
                "pack_episodes": cfg.pack_episodes,
                **shape,
                "read_ms": round(read, 1),
                "pack_ms": round(packed_ms, 1),
                "build_ms": round(read + packed_ms, 1),
                "commit": commit,
            }
        )
    )


if __name__ == "__main__":
    main()

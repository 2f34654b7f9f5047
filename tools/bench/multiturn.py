"""Multi-turn cost through `stacx run`: log bytes per episode and train positions per step, with
and without packed-episode training.

Writes a small recipe (below) and image-less tasks, then runs ``stacx run`` on it twice, the
same way a user does (a subprocess of ``python -m stacx run RECIPE``):

- before: ``--set trainer.pack_episodes=false``: the trainer reads every turn's whole prompt
  (the training view's rows) and forwards one sample per turn;
- after: ``--set trainer.pack_episodes=true`` (the default): the trainer reads the stored
  deltas and forwards one packed sequence per episode (segment).

The recipe: the SWE agent loop (bash format) with the default model (SmolLM2-135M) as its
policy, greedy, one episode at a time (``engine.max_batch = 1``, ``sandbox.concurrency = 1``,
so both runs roll out the same token ids), up to ``--turns`` turns per episode, the process
sandbox (no Docker); then one SFT step on every turn (``trainer.filter``: every episode),
with only the final norm trainable (the forward still runs every layer).

Everything is then read from each run's DuckDB log (``stacx.store.db.connect_run``, what
``stacx sql`` opens):

- bytes per episode, as stored (``turn_generated``: each turn's new prompt ids after
  ``prefix_len``) and in the whole-prompt form that every log held before ``prefix_len`` (the
  ``turns`` view rebuilds it; that IS the "before" storage): the token arrays (4 bytes per id,
  8 per logprob), the table alone in DuckDB's storage (a fresh file of 16 KiB blocks) and as
  zstd Parquet (a general-purpose compressor finds much of the repeated prefixes);
- per train step (``train_steps``, ``metrics_json``): positions forwarded, sequences, rows,
  loss tokens, step time, the batch read's time and the prompt ids it materialized (whole
  prompts per turn before; the stored ids after), loss.

The two runs' turns are checked equal (else the comparison is void and the script fails) and
their losses equal up to float rounding (tests/train/test_episode_packing.py checks logprobs
and gradients exactly on a tiny fp64 model).

    python tools/bench/multiturn.py [--tasks 2] [--turns 10] [--max-new-tokens 32] [--work DIR]

Prints the machine and versions to stderr, then ONE JSON line last.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

import duckdb

from stacx.store import db

ROOT = Path(__file__).resolve().parents[2]

RECIPE = """\
name = "bench-multiturn"
description = "multi-turn SWE episodes of the default model, then one SFT step on every turn"
[model]
path = "default"
[engine]
backend = "torch"
device = "cpu"
max_batch = 1          # one sequence at a time: greedy outputs independent of batching
[sandbox]
backend = "process"    # image-less tasks, no Docker
concurrency = 1
max_attempts = 1
[tasks]
path = "{tasks}"
per_iteration = {n_tasks}
group_size = 1
max_iterations = 1
[agent]
name = "swe"
format = "bash"
max_turns = {turns}
max_new_tokens = {max_new_tokens}
temperature = 0.0      # greedy: both runs roll out the same ids
[algorithm]
name = "sft"
[trainer]
steps = 1
batch_episodes = {n_tasks}
filter = "reward >= 0"           # every scored episode (the default keeps solved ones)
trainable = '^model\\.norm\\.weight$'
share_prompts = false
keep_last = 0
[logging]
progress = "plain"
plot = false
tensorboard = false
"""

INSTRUCTIONS = (
    "Print the numbers 1 to 20 with seq, one command per reply, then count them with wc.",
    "Write the words of a short poem into /app/poem.txt, one command per reply, then count "
    "its words with wc.",
    "List the files in /app and /tmp, one command per reply, then print today's date.",
    "Create the directories /app/a, /app/b and /app/c, one command per reply, then list them.",
)


def write_tasks(root: Path, n: int) -> None:
    """Image-less Harbor tasks (no environment/Dockerfile: the process sandbox runs them) whose
    verifier always passes: the bench measures cost, not skill."""
    for i in range(n):
        d = root / f"multiturn-{i}"
        for rel, text in {
            "instruction.md": INSTRUCTIONS[i % len(INSTRUCTIONS)] + "\n",
            "task.toml": 'version = "1.0"\n[environment]\nmemory_mb = 512\n'
            "[verifier]\ntimeout_sec = 60\n",
            "tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
            "solution/solve.sh": "#!/bin/bash\ntrue\n",
        }.items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_text(text)


def stacx_run(recipe: Path, run_dir: Path, pack: bool) -> float:
    cmd = [
        sys.executable,
        "-m",
        "stacx",
        "run",
        str(recipe),
        "--run-dir",
        str(run_dir),
        "--quiet",
        "--set",
        f"trainer.pack_episodes={str(pack).lower()}",
    ]
    print("$", " ".join(cmd[1:]), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(
            f"stacx run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return time.perf_counter() - t0


# turn_generated as stored, and as every log before prefix_len stored it (whole prompts)
STORED = "SELECT * FROM turn_generated"
WHOLE = (
    "SELECT g.* REPLACE (t.prompt_ids AS prompt_ids, 0::BIGINT AS prefix_len) "
    "FROM turn_generated g JOIN turns t USING (event_id)"
)
ARRAY_BYTES = (
    "SELECT sum(4 * (len(prompt_ids) + len(output_ids)) + 8 * coalesce(len(logprobs), 0)) FROM ({})"
)


def duckdb_bytes(con: duckdb.DuckDBPyConnection, sql: str, work: Path, name: str) -> int:
    """What `sql`'s rows take in DuckDB's own storage: written alone into a fresh database
    file of 16 KiB blocks, the used blocks minus those of an empty copy (the run file's 256
    KiB blocks are too coarse for a few episodes)."""
    rows = con.sql(sql).to_arrow_table()
    scratch = duckdb.connect()  # the run's connection is read-only
    scratch.register("rows", rows)
    used = []
    for suffix, where in (("full", ""), ("empty", "WHERE false")):
        alias = f"{name}_{suffix}"
        scratch.execute(f"ATTACH '{work / alias}.duckdb' AS {alias} (BLOCK_SIZE 16384)")
        scratch.execute(f"CREATE TABLE {alias}.t AS SELECT * FROM rows {where}")
        scratch.execute(f"CHECKPOINT {alias}")
        (size,) = scratch.execute(
            "SELECT used_blocks * block_size FROM pragma_database_size() "
            f"WHERE database_name = '{alias}'"
        ).fetchone() or (0,)
        scratch.execute(f"DETACH {alias}")
        (work / f"{alias}.duckdb").unlink()
        used.append(int(size))
    scratch.close()
    return used[0] - used[1]


def measure(run_dir: Path, work: Path) -> dict[str, object]:
    con = db.connect_run(run_dir)
    (n_episodes,) = con.execute("SELECT count(*) FROM episodes").fetchone() or (0,)
    n = max(int(n_episodes), 1)
    out: dict[str, object] = {
        "episodes": int(n_episodes),
        "turns": con.execute("SELECT count(*) FROM turns").fetchone()[0],  # type: ignore[index]
    }
    for form, sql in (("stored", STORED), ("whole", WHOLE)):
        (array_bytes,) = con.execute(ARRAY_BYTES.format(sql)).fetchone() or (0,)
        parquet = work / f"{run_dir.name}-{form}.parquet"
        con.execute(f"COPY ({sql}) TO '{parquet}' (FORMAT parquet, COMPRESSION zstd)")
        out[f"{form}_token_array_bytes_per_episode"] = int(array_bytes) // n
        out[f"{form}_duckdb_bytes_per_episode"] = duckdb_bytes(con, sql, work, form) // n
        out[f"{form}_parquet_bytes_per_episode"] = parquet.stat().st_size // n
    (step,) = con.execute(
        "SELECT tokens, n_samples, duration_ms, loss, metrics_json FROM train_steps"
    ).fetchall()
    tokens, rows, step_ms, loss, metrics_json = step
    metrics = json.loads(metrics_json)
    out |= {
        "train_positions_per_step": int(tokens),
        "train_sequences_per_step": int(metrics["n_sequences"]),
        "train_rows_per_step": int(rows),
        "loss_tokens_per_step": int(metrics["n_loss_tokens"]),
        "step_ms": round(float(step_ms), 1),
        "batch_read_ms": round(float(metrics["batch_ms"]), 1),
        "batch_prompt_ids_per_step": int(metrics["batch_prompt_ids"]),  # materialized in Arrow
        "loss": float(loss),
    }
    # what both runs must share: the rolled-out ids, per (task, turn)
    out["_turns"] = con.execute(
        "SELECT e.task_id, t.turn, t.prompt_ids, t.output_ids FROM turns t "
        "JOIN episodes e USING (episode_id) ORDER BY ALL"
    ).fetchall()
    con.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tasks", type=int, default=2, help="episodes (one per task)")
    ap.add_argument("--turns", type=int, default=10, help="agent.max_turns")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="agent.max_new_tokens")
    ap.add_argument("--work", type=Path, default=None, help="keep the runs here (default: temp)")
    args = ap.parse_args()
    print(
        f"machine: {platform.machine()} {os.cpu_count()} cpus, python "
        f"{platform.python_version()}, torch {version('torch')}, duckdb {duckdb.__version__}, "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        file=sys.stderr,
    )
    with tempfile.TemporaryDirectory(prefix="stacx-multiturn-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        write_tasks(work / "tasks", args.tasks)
        recipe = work / "multiturn.toml"
        recipe.write_text(
            RECIPE.format(
                tasks=work / "tasks",
                n_tasks=args.tasks,
                turns=args.turns,
                max_new_tokens=args.max_new_tokens,
            )
        )
        out: dict[str, dict[str, object]] = {}
        for name, pack in (("before", False), ("after", True)):
            run_dir = work / f"run-{name}"
            wall = stacx_run(recipe, run_dir, pack)
            out[name] = measure(run_dir, work) | {"run_wall_s": round(wall, 1)}
            shown = {k: v for k, v in out[name].items() if not k.startswith("_")}
            print(name, shown, file=sys.stderr, flush=True)
    b, a = out["before"], out["after"]
    if b.pop("_turns") != a.pop("_turns"):
        raise SystemExit("the two runs rolled out different turns: the comparison is void")
    loss_b, loss_a = float(b["loss"]), float(a["loss"])  # type: ignore[arg-type]
    same_loss = (
        abs(loss_b - loss_a) <= 1e-5 * max(1.0, abs(loss_b))
        and b["loss_tokens_per_step"] == a["loss_tokens_per_step"]
    )

    def ratio(x: object, y: object) -> float:
        return round(float(x) / max(float(y), 1.0), 2)  # type: ignore[arg-type]

    result = {
        "bench": "multiturn",
        "episodes": a["episodes"],
        "turns": a["turns"],
        "before": b,
        "after": a,
        "same_turns": True,
        "same_loss": same_loss,
        # storage: the whole-prompt form (every log before prefix_len) over the stored form
        "token_array_bytes_ratio": ratio(
            a["whole_token_array_bytes_per_episode"], a["stored_token_array_bytes_per_episode"]
        ),
        "duckdb_bytes_ratio": ratio(
            a["whole_duckdb_bytes_per_episode"], a["stored_duckdb_bytes_per_episode"]
        ),
        "parquet_bytes_ratio": ratio(
            a["whole_parquet_bytes_per_episode"], a["stored_parquet_bytes_per_episode"]
        ),
        # training: pack_episodes = false over true
        "train_positions_ratio": ratio(
            b["train_positions_per_step"], a["train_positions_per_step"]
        ),
        "step_time_ratio": ratio(b["step_ms"], a["step_ms"]),
        "batch_read_time_ratio": ratio(b["batch_read_ms"], a["batch_read_ms"]),
        "batch_prompt_ids_ratio": ratio(
            b["batch_prompt_ids_per_step"], a["batch_prompt_ids_per_step"]
        ),
    }
    print(json.dumps(result))
    if not same_loss:
        raise SystemExit(f"losses differ: {loss_b} (before) vs {loss_a} (after)")


if __name__ == "__main__":
    main()

"""What a run of the tiny GRPO recipe must end with, however often it was interrupted: its shape
(what the recipe determines; see test_crash.py's docstring) and no row recorded twice. Checked on
an uninterrupted run by test_real.py, on killed and resumed ones by test_crash.py and
test_processes.py."""

from __future__ import annotations

from pathlib import Path

import duckdb

from stacx.store import db

# Derived identities that must each have one row (the rest: one row per event id).
KEYS = {
    "task_scheduled": "group_id",
    "episode_started": "episode_id",
    "episode_finished": "episode_id",
    "reward_assigned": "episode_id",
    "turn_generated": "episode_id, turn",
    "train_step_finished": "step",
    "weights_published": "version",
}


def _value(con: duckdb.DuckDBPyConnection, sql: str) -> object:
    row = con.execute(sql).fetchone()
    assert row is not None
    return row[0]


def duplicates(run_dir: Path) -> dict[str, int]:
    """Rows recorded twice: per event id in `_events` and every per-kind table, per derived key."""
    con = db.connect_run(run_dir)
    try:
        tables = [
            r[0]
            for r in con.execute(
                "select table_name from information_schema.tables where table_type = 'BASE TABLE' "
                "and table_name not like '\\_%' escape '\\' and table_name in ("
                "select table_name from information_schema.columns where column_name = 'event_id')"
            ).fetchall()
        ]
        out = {}
        for t in ["_events", *tables]:
            sql = f'select count(*) - count(distinct event_id) from "{t}"'
            out[f"{t}.event_id"] = int(_value(con, sql))  # type: ignore[call-overload]
        for t, key in KEYS.items():
            sql = f"select count(*) from (select {key} from {t} group by all having count(*) > 1)"
            out[f"{t}({key})"] = int(_value(con, sql))  # type: ignore[call-overload]
    finally:
        con.close()
    return {k: v for k, v in out.items() if v}


SHAPE_SQL = {
    "versions": "select list(version order by version) from weights_published",
    "steps": "select list(step order by step) from train_step_finished",
    "groups_per_iteration": "select list([iteration, n] order by iteration) from "
    "(select iteration, count(*) as n from task_scheduled group by 1)",
    "scored_per_group": "select list([iteration, n, k] order by iteration) from ("
    "select g.iteration, count(e.episode_id) as n, count(distinct e.sample_index) as k "
    "from task_scheduled g left join episodes e on e.group_id = g.group_id "
    "and e.status = 'scored' group by g.group_id, g.iteration)",
    "trained_per_step": "select list([step, len(episode_ids)] order by step) "
    "from train_step_finished",
    # sync mode: step k trains on exactly the scored episodes of iteration k-1 ...
    "step_k_trains_on_iteration_k_minus_1": """
        select bool_and(coalesce(t.ids = s.ids, false)) from (
            select step, list_sort(episode_ids) as ids from train_step_finished) t
        left join (select iteration + 1 as step, list_sort(list(episode_id)) as ids
                   from episodes where status = 'scored' group by iteration) s using (step)""",
    # ... which version k-1 generated (the rollouts used the new weights)
    "versions_per_iteration": "select list([iteration, lo, hi] order by iteration) from ("
    "select e.iteration, min(t.weight_version) as lo, max(t.weight_version) as hi "
    "from episodes e join turns t using (episode_id) where e.status = 'scored' group by 1)",
}


def shape(run_dir: Path) -> dict[str, object]:
    """What the recipe determines about a finished run (see the module docstring)."""
    con = db.connect_run(run_dir)
    try:
        return {k: _value(con, sql) for k, sql in SHAPE_SQL.items()}
    finally:
        con.close()


def recipe_shape(steps: int, group_size: int = 2) -> dict[str, object]:
    """`shape` as the recipe's arithmetic has it for ``steps`` steps of one group per iteration
    (sync mode): what an uninterrupted run ends with, and so what a resumed one must."""
    return {
        "versions": list(range(1, steps + 1)),
        "steps": list(range(1, steps + 1)),
        "groups_per_iteration": [[i, 1] for i in range(steps)],
        "scored_per_group": [[i, group_size, group_size] for i in range(steps)],
        "trained_per_step": [[k, group_size] for k in range(1, steps + 1)],
        "step_k_trains_on_iteration_k_minus_1": True,
        "versions_per_iteration": [[i, i, i] for i in range(steps)],
    }

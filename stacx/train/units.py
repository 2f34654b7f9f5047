"""Readiness and batch selection in SQL over the log (pure functions that build queries). A *unit*
(the algorithm's: a ready view and a ``complete`` predicate) is taken whole or not at all, so a step
never trains on a half-labeled unit. Queries bind every value that is not an identifier from the
validated config.
Design: docs/training.md#units-and-readiness
"""

from __future__ import annotations

import re

from stacx.train.algorithms import algorithm_for, row_filter, source_view
from stacx.train.config import TrainerConfig

Params = dict[str, object]


def _where(cfg: TrainerConfig) -> str:
    where = row_filter(cfg)
    return f"WHERE ({where})" if where else ""


_TRAINED = (
    "SELECT DISTINCT unnest(episode_ids) AS episode_id FROM train_step_finished "
    "WHERE weight_version <= $version"
)


def complete_units_sql(cfg: TrainerConfig) -> str:
    """Rows (unit_id, episode_ids, iteration, min_version, ready_ts) of every complete unit: the
    source view's filtered rows joined to the algorithm's ready view."""
    a = algorithm_for(cfg)
    version = "min(weight_version)" if a.versioned else "NULL::BIGINT"
    return f"""
WITH src AS (
    SELECT {a.unit_key} AS unit_key, {a.episode_column} AS episode_id,
           {version} AS min_version, max(ts) AS ts
    FROM {source_view(cfg)} {_where(cfg)} GROUP BY ALL
)
SELECT u.unit_id,
       list(DISTINCT s.episode_id ORDER BY s.episode_id) AS episode_ids,
       any_value(u.iteration) AS iteration,
       min(s.min_version) AS min_version,
       max(coalesce(u.ready_ts, s.ts)) AS ready_ts
FROM src s
JOIN {a.ready_view} u ON u.episode_id = s.unit_key
WHERE ({a.complete}) AND s.episode_id IS NOT NULL
GROUP BY u.unit_id"""


def params(cfg: TrainerConfig, sql: str, version: int, **extra: object) -> Params:
    """The bound parameters `sql` names (DuckDB refuses parameters a query does not use)."""
    values: Params = {
        "version": int(version),
        "next": int(version) + 1,
        "step": int(version) + 1,
        "label_actors": list(cfg.label_actors),
        "branches": int(cfg.branches),
        "iteration": int(version) // cfg.steps_per_iteration,  # the rollout iteration trained on
        **extra,
    }
    return {k: v for k, v in values.items() if re.search(rf"\${k}\b", sql)}


def ready_units_sql(cfg: TrainerConfig) -> str:
    """Rows (unit_id, episode_ids, min_version, ready_ts, trained) of the units the next step may
    use, in the order it takes them."""
    units = f"""
WITH units AS ({complete_units_sql(cfg)}),
trained AS ({_TRAINED})"""
    if algorithm_for(cfg).dataset:
        return f"""{units}
SELECT * FROM (
    SELECT u.unit_id, u.episode_ids, u.min_version, u.ready_ts,
           EXISTS (SELECT 1 FROM trained t WHERE list_contains(u.episode_ids, t.episode_id))
               AS trained
    FROM units u
)
ORDER BY trained,
         CASE WHEN trained THEN md5(unit_id || ':' || CAST($step AS VARCHAR)) END,
         ready_ts, unit_id"""
    fresh = ""
    if algorithm_for(cfg).fresh_only:
        fresh = f"AND $version - coalesce(u.min_version, $version) <= {int(cfg.staleness_limit)}"
    return f"""{units}
SELECT u.unit_id, u.episode_ids, u.min_version, u.ready_ts, false AS trained
FROM units u
WHERE NOT EXISTS (
    SELECT 1 FROM trained t WHERE list_contains(u.episode_ids, t.episode_id)) {fresh}
ORDER BY u.ready_ts, u.unit_id"""


def _waiting(cfg: TrainerConfig) -> str:
    """Rows (iteration) of done units that still wait for a signal (labels, scores, branches)."""
    a = algorithm_for(cfg)
    if not a.waits:
        return "SELECT NULL::BIGINT AS iteration WHERE false"
    return f"""SELECT any_value(u.iteration) AS iteration FROM {a.ready_view} u
WHERE ({a.done}) AND NOT ({a.complete}) GROUP BY u.unit_id"""


def waiting_sql(cfg: TrainerConfig) -> str:
    """One row: how many done roll-ins wait for labels, scores or branches."""
    return f"SELECT count(*) FROM ({_waiting(cfg)})"


def pending_sql(cfg: TrainerConfig) -> str:
    """Rows (iteration, pending): per iteration, samples not done plus done units still waiting."""
    return f"""
WITH done AS (SELECT group_id, count(*) FILTER (WHERE done) AS n_done FROM samples GROUP BY group_id),
missing AS (
    SELECT s.iteration, greatest(s.n_samples - coalesce(d.n_done, 0), 0) AS n
    FROM scheduled_groups s LEFT JOIN done d USING (group_id)
    WHERE NOT s.lost
),
waiting AS ({_waiting(cfg)})
SELECT iteration, sum(n)::BIGINT AS pending FROM (
    SELECT iteration, n FROM missing
    UNION ALL SELECT iteration, 1 AS n FROM waiting
) GROUP BY iteration ORDER BY iteration"""


def gate_sql(cfg: TrainerConfig) -> str | None:
    """One row (open): may the step after ``$version`` run? None in async mode."""
    if cfg.mode != "sync":
        return None
    evals = """NOT EXISTS (
    SELECT 1 FROM scheduled_groups g
    LEFT JOIN (SELECT group_id, count(*) FILTER (WHERE done) AS n_done FROM samples
               GROUP BY group_id) d USING (group_id)
    WHERE g.is_eval AND NOT g.lost AND g.weight_version <= $version
      AND coalesce(d.n_done, 0) < g.n_samples)"""
    if algorithm_for(cfg).per_group:
        return f"SELECT {evals} AS open"
    return f"""
WITH p AS ({pending_sql(cfg)})
SELECT EXISTS (SELECT 1 FROM task_scheduled WHERE iteration >= $iteration)
   AND NOT EXISTS (SELECT 1 FROM p WHERE iteration <= $iteration AND pending > 0)
   AND {evals} AS open"""


def batch_rows_sql(cfg: TrainerConfig, columns: str = "*") -> str:
    """The source view's rows of ``$episode_ids`` in a stable order (``columns``: the select)."""
    a, where = algorithm_for(cfg), row_filter(cfg)
    ep = a.episode_column
    extra = f"AND ({where})" if where else ""
    return (
        f"SELECT {columns} FROM {source_view(cfg)} WHERE list_contains($episode_ids, {ep}) "
        f"{extra} ORDER BY {ep}, {a.row_order}"
    )


def trainer_state_sql() -> str:
    """One row: the latest committed weight version of this log and its checkpoint path."""
    return (
        "SELECT version, path, sha256 FROM weights_published ORDER BY version DESC, ts DESC LIMIT 1"
    )


def redo_steps_sql() -> str:
    """Rows (version, episode_ids) of the recorded steps after ``$durable`` up to ``$published`` and
    the one after it: what a resumed trainer redoes, in order (a step's first record wins)."""
    return (
        "SELECT weight_version AS version, arg_min(episode_ids, ts) AS episode_ids "
        "FROM train_step_finished WHERE weight_version > $durable "
        "AND weight_version <= $published + 1 GROUP BY 1 ORDER BY 1"
    )

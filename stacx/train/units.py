"""Readiness and batch selection, in SQL over the log (pure functions that build queries).

A *unit* is what the trainer takes whole or not at all. It is **complete** only when every
signal it waits for is in the log, so a step can never run on a half-labeled unit and then
exclude the rest for good. What a unit is and when it is complete is the algorithm's
(``stacx.train.algorithms``): a view of ``events/views/30_ready.sql`` (``ready_view``) and a
predicate over it (``complete``); this module joins the source view's filtered rows to it, the
same way for every algorithm.

:func:`ready_units_sql` lists the complete units the next step may use:

- algorithms that use a unit once (grpo, rloo, opd, aggrevate): units already in the
  ``episode_ids`` of a committed ``train_step_finished`` are left out, and (``fresh_only``:
  grpo, rloo, opd) units older than ``staleness`` versions are left out too;
- *dataset* algorithms (sft, dagger) train on the aggregate (DAgger's union over all
  iterations): every complete unit stays usable; units not trained on yet come first, then the
  rest in a deterministic shuffle of (unit, step), so ``steps_per_iteration`` steps after one
  roll-in iteration are epochs over everything labeled so far.

:func:`gate_sql` is the sync-mode barrier: the step after version ``v`` waits until the
periodic eval pinned to ``v`` (and earlier) is done, and, unless a unit is a whole group
(``per_group``), until iteration ``v // steps_per_iteration`` is scheduled and nothing of it,
or of an earlier iteration, is in flight (every sample done, every unit complete).
:func:`pending_sql` is the in-flight count the scheduler uses to decide that nothing is in
flight. Queries take bound parameters (``$name``) for every value that is not an identifier
from the validated config.
"""

from __future__ import annotations

import re

from stacx.train.config import TrainerConfig

Params = dict[str, object]


def _where(cfg: TrainerConfig) -> str:
    return f"WHERE ({cfg.row_filter})" if cfg.row_filter else ""


def _trained() -> str:
    return (
        "SELECT DISTINCT unnest(episode_ids) AS episode_id FROM train_step_finished "
        "WHERE weight_version <= $version"
    )


def complete_units_sql(cfg: TrainerConfig) -> str:
    """Rows (unit_id, episode_ids, iteration, min_version, ready_ts) of every complete unit of
    the source view: its filtered rows joined to the algorithm's ready view (a unit's
    ready_ts is the view's, else its rows' latest ts); parameters: :func:`params`."""
    a = cfg.algo
    version = "min(weight_version)" if a.versioned else "NULL::BIGINT"
    return f"""
WITH src AS (
    SELECT {a.unit_key} AS unit_key, {a.episode_column} AS episode_id,
           {version} AS min_version, max(ts) AS ts
    FROM {cfg.source_view} {_where(cfg)} GROUP BY ALL
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
    """The bound parameters of `sql` (one of this module's queries): the values it names
    (DuckDB refuses parameters a query does not use)."""
    values: Params = {
        "version": int(version),
        "next": int(version) + 1,
        "step": int(version) + 1,
        "label_actors": list(cfg.label_actors),
        "branches": int(cfg.branches),
        "iteration": step_iteration(cfg, version),
        **extra,
    }
    return {k: v for k, v in values.items() if re.search(rf"\${k}\b", sql)}


def ready_units_sql(cfg: TrainerConfig) -> str:
    """Rows (unit_id, episode_ids, min_version, ready_ts, trained) of the units the next step
    may use, in the order it takes them (bind :func:`params`)."""
    if cfg.algo.dataset:
        return f"""
WITH units AS ({complete_units_sql(cfg)}),
trained AS ({_trained()})
SELECT * FROM (
    SELECT u.unit_id, u.episode_ids, u.min_version, u.ready_ts,
           EXISTS (SELECT 1 FROM trained t WHERE list_contains(u.episode_ids, t.episode_id))
               AS trained
    FROM units u
)
ORDER BY trained,
         CASE WHEN trained THEN md5(unit_id || ':' || CAST($step AS VARCHAR)) END,
         ready_ts, unit_id"""
    staleness = cfg.staleness_limit if cfg.algo.fresh_only else None
    fresh = (
        f"AND $version - coalesce(u.min_version, $version) <= {int(staleness)}"
        if staleness is not None
        else ""
    )
    return f"""
WITH units AS ({complete_units_sql(cfg)}),
trained AS ({_trained()})
SELECT u.unit_id, u.episode_ids, u.min_version, u.ready_ts, false AS trained
FROM units u
WHERE NOT EXISTS (
    SELECT 1 FROM trained t WHERE list_contains(u.episode_ids, t.episode_id)) {fresh}
ORDER BY u.ready_ts, u.unit_id"""


def _waiting(cfg: TrainerConfig) -> str:
    """Rows (iteration) of done units that still wait for a signal (labels, scores, branches)."""
    a = cfg.algo
    if not a.waits:
        return "SELECT NULL::BIGINT AS iteration WHERE false"
    return f"""SELECT any_value(u.iteration) AS iteration FROM {a.ready_view} u
WHERE ({a.done}) AND NOT ({a.complete}) GROUP BY u.unit_id"""


def waiting_sql(cfg: TrainerConfig) -> str:
    """One row: how many done roll-ins wait for labels, scores or branches. Bind :func:`params`."""
    return f"SELECT count(*) FROM ({_waiting(cfg)})"


def pending_sql(cfg: TrainerConfig) -> str:
    """Rows (iteration, pending): per scheduled iteration, the samples not done plus the done
    units still waiting for a signal (labels, scores, branches). Bind :func:`params`."""
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
    """One row (open): may the step after ``$version`` run? None in async mode.

    Sync mode: the periodic eval of every version up to ``$version`` is done (so an eval pinned
    to v runs on v: the engine serves one version at a time, and publishing v+1 mid-eval would
    score part of "v" on v+1), and, unless a unit is a whole group already (``per_group``),
    ``$iteration`` (:func:`step_iteration`) is scheduled and settled.
    The scheduler publishes a version's eval groups before its training groups, so an eval is
    in the log before the step it gates could be ready. Bind :func:`params`."""
    if cfg.mode != "sync":
        return None
    evals = """NOT EXISTS (
    SELECT 1 FROM scheduled_groups g
    LEFT JOIN (SELECT group_id, count(*) FILTER (WHERE done) AS n_done FROM samples
               GROUP BY group_id) d USING (group_id)
    WHERE g.is_eval AND NOT g.lost AND g.weight_version <= $version
      AND coalesce(d.n_done, 0) < g.n_samples)"""
    if cfg.algo.per_group:
        return f"SELECT {evals} AS open"
    return f"""
WITH p AS ({pending_sql(cfg)})
SELECT EXISTS (SELECT 1 FROM task_scheduled WHERE iteration >= $iteration)
   AND NOT EXISTS (SELECT 1 FROM p WHERE iteration <= $iteration AND pending > 0)
   AND {evals} AS open"""


def step_iteration(cfg: TrainerConfig, version: int) -> int:
    """The rollout iteration whose data the step after `version` trains on (sync mode)."""
    return int(version) // cfg.steps_per_iteration


def batch_rows_sql(cfg: TrainerConfig, columns: str = "*") -> str:
    """The source view's rows of the chosen episodes (``$episode_ids``), in a stable order;
    ``columns``: the select list (``stacx.train.batches.step_batch`` leaves prompts out when
    the view carries its chain)."""
    ep = cfg.algo.episode_column
    extra = f"AND ({cfg.row_filter})" if cfg.row_filter else ""
    return (
        f"SELECT {columns} FROM {cfg.source_view} WHERE list_contains($episode_ids, {ep}) {extra} "
        f"ORDER BY {ep}, {cfg.algo.row_order}"
    )


def trainer_state_sql() -> str:
    """One row: the latest committed weight version of this log and its checkpoint path."""
    return (
        "SELECT version, path, sha256 FROM weights_published ORDER BY version DESC, ts DESC LIMIT 1"
    )


def redo_steps_sql() -> str:
    """Rows (version, episode_ids) of the recorded steps after the durable version ``$durable``
    up to the published ``$published`` and the one after it (recorded, never published): what a
    resumed trainer redoes, in order (the first record of a step wins: a redo re-records it)."""
    return (
        "SELECT weight_version AS version, arg_min(episode_ids, ts) AS episode_ids "
        "FROM train_step_finished WHERE weight_version > $durable "
        "AND weight_version <= $published + 1 GROUP BY 1 ORDER BY 1"
    )

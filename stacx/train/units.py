"""Readiness and batch selection, in SQL over the log (pure functions that build queries).

A *unit* is what the trainer takes whole or not at all. It is **complete** only when every
signal it waits for is in the log, so a step can never run on a half-labeled unit and then
exclude the rest for good:

=========== ====================== ======================================================
algorithm   unit                   complete when
=========== ====================== ======================================================
grpo        a group                every scheduled sample is done (``samples.done``)
sft         an episode             it is scored
dagger      a roll-in episode      it ended, and every visited state whose actor is in
                                   ``label_actors`` has a TeacherLabeled, or a recorded
                                   teacher failure (InfraFailed with that ``turn``)
opd         a roll-in episode      it is scored, and every student turn with output has a
                                   TeacherScored or a recorded teacher failure
aggrevate   a parent episode       it is scored, and it has ``branches`` explored branches
                                   each with a CostToGoEstimated or an InfraFailed (a
                                   parent without turns has none to wait for)
=========== ====================== ======================================================

:func:`ready_units_sql` lists the complete units the next step may use:

- *on-policy and cost-sensitive* algorithms (grpo, opd, aggrevate) use a unit once: units
  already in the ``episode_ids`` of a committed ``train_step_finished`` are left out, and
  (grpo, opd) units older than ``staleness`` versions are left out too;
- *dataset* algorithms (sft, dagger) train on the aggregate (DAgger's union over all
  iterations): every complete unit stays usable; units not trained on yet come first, then the
  rest in a deterministic shuffle of (unit, step), so ``steps_per_iteration`` steps after one
  roll-in iteration are epochs over everything labeled so far.

:func:`gate_sql` is the sync-mode barrier: the step after version ``v`` waits until the
periodic eval pinned to ``v`` (and earlier) is done, and, for the non-GRPO algorithms, until
iteration ``v // steps_per_iteration`` is scheduled and nothing of it, or of an earlier
iteration, is in flight (every sample done, every unit complete). GRPO's unit is the whole
group already. :func:`pending_sql` is the in-flight count the scheduler uses to decide
that nothing is in flight. Queries take bound parameters (``$name``) for every value that is not
an identifier from the validated config.
"""

from __future__ import annotations

import re
from typing import Final

from stacx.train.config import TrainerConfig

# The column holding the episode a source row belongs to (for lineage and batch selection).
EPISODE_COLUMN: Final = {
    "grpo": "episode_id",
    "opd": "episode_id",
    "sft": "episode_id",
    "dagger": "episode_id",
    "aggrevate": "branch_episode_id",
}

DATASET_ALGORITHMS: Final = ("sft", "dagger")
ROLL_IN_POLICIES: Final = ("student", "mixture")

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
    the source view (see the module table); ``$label_actors`` / ``$branches`` are bound by
    :func:`params`."""
    ep = EPISODE_COLUMN[cfg.algorithm]
    src = (
        f"SELECT {ep} AS episode_id, min(weight_version) AS min_version "
        f"FROM {cfg.source_view} {_where(cfg)} GROUP BY ALL"
    )
    if cfg.algorithm == "grpo":
        return f"""
WITH groups AS (
    SELECT group_id, max(iteration) AS iteration,
           count(*) FILTER (WHERE done) AS n_done, count(*) AS n_seen, max(done_ts) AS ready_ts
    FROM samples GROUP BY group_id
),
src AS ({src})
SELECT g.group_id AS unit_id,
       list(DISTINCT s.episode_id ORDER BY s.episode_id) AS episode_ids,
       any_value(g.iteration) AS iteration,
       min(s.min_version) AS min_version,
       max(g.ready_ts) AS ready_ts
FROM src s
JOIN episodes e USING (episode_id)
JOIN groups g ON g.group_id = e.group_id
LEFT JOIN scheduled_groups sc ON sc.group_id = e.group_id
WHERE g.n_done >= coalesce(sc.n_samples, g.n_seen)
GROUP BY g.group_id"""
    if cfg.algorithm == "aggrevate":
        return f"""
WITH src AS (
    SELECT parent_episode_id, {ep} AS episode_id, max(ts) AS ts
    FROM {cfg.source_view} {_where(cfg)} GROUP BY ALL
),
parents AS ({_aggrevate_parents()})
SELECT s.parent_episode_id AS unit_id,
       list(DISTINCT s.episode_id ORDER BY s.episode_id) AS episode_ids,
       any_value(p.iteration) AS iteration,
       NULL::BIGINT AS min_version,
       max(s.ts) AS ready_ts
FROM src s
JOIN parents p ON p.episode_id = s.parent_episode_id
WHERE p.complete AND s.episode_id IS NOT NULL
GROUP BY s.parent_episode_id"""
    if cfg.algorithm == "dagger":
        complete = (
            f"e.status IN ('scored', 'finished', 'failed') AND e.episode_id NOT IN ({_unlabeled()})"
        )
    elif cfg.algorithm == "opd":
        complete = f"e.status = 'scored' AND e.episode_id NOT IN ({_unscored()})"
    else:
        complete = "e.status = 'scored'"
    return f"""
WITH src AS ({src})
SELECT s.episode_id AS unit_id,
       [s.episode_id] AS episode_ids,
       any_value(e.iteration) AS iteration,
       min(s.min_version) AS min_version,
       max(e.finished_ts) AS ready_ts
FROM src s
JOIN episodes e USING (episode_id)
WHERE {complete}
GROUP BY s.episode_id"""


def _turn_failed(alias: str) -> str:
    return (
        f"EXISTS (SELECT 1 FROM infra_failed f WHERE f.episode_id = {alias}.episode_id "
        f"AND f.turn = {alias}.turn)"
    )


def _roll_in() -> str:
    policies = ", ".join(f"'{p}'" for p in ROLL_IN_POLICIES)
    return (
        "SELECT DISTINCT episode_id FROM episode_started "
        f"WHERE CAST(policy AS VARCHAR) IN ({policies})"
    )


def _unlabeled() -> str:
    """Roll-in episodes with a visited state still waiting for its teacher label."""
    return f"""SELECT t.episode_id FROM turn_generated t
WHERE t.episode_id IN ({_roll_in()}) AND list_contains($label_actors, CAST(t.actor AS VARCHAR))
  AND NOT EXISTS (SELECT 1 FROM teacher_labeled l
                  WHERE l.episode_id = t.episode_id AND l.turn = t.turn)
  AND NOT {_turn_failed("t")}"""


def _unscored() -> str:
    """Roll-in episodes with a student turn still waiting for its teacher score."""
    return f"""SELECT t.episode_id FROM turn_generated t
WHERE t.episode_id IN ({_roll_in()}) AND CAST(t.actor AS VARCHAR) = 'student'
  AND len(t.output_ids) > 0
  AND NOT EXISTS (SELECT 1 FROM teacher_scored x
                  WHERE x.episode_id = t.episode_id AND x.turn = t.turn)
  AND NOT {_turn_failed("t")}"""


def _aggrevate_parents() -> str:
    """Scored roll-in parents, with whether all their branches have an outcome."""
    return f"""SELECT p.episode_id, p.iteration,
       p.n_turns = 0 OR (
         SELECT count(*) FROM branch_created b WHERE b.parent_episode_id = p.episode_id AND (
           EXISTS (SELECT 1 FROM cost_to_go_estimated c WHERE c.branch_id = b.branch_id)
           OR EXISTS (SELECT 1 FROM infra_failed f WHERE f.episode_id = b.episode_id))
       ) >= $branches AS complete
FROM episodes p
WHERE p.episode_id IN ({_roll_in()}) AND p.status = 'scored'"""


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
    if cfg.algorithm in DATASET_ALGORITHMS:
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
    staleness = cfg.staleness_limit if cfg.algorithm in ("grpo", "opd") else None
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
    """Rows (iteration) of done roll-ins whose unit still waits for a teacher signal."""
    if cfg.algorithm == "dagger":
        return f"""SELECT e.iteration FROM episodes e
WHERE e.status IN ('scored', 'finished', 'failed') AND e.episode_id IN ({_unlabeled()})"""
    if cfg.algorithm == "opd":
        return f"""SELECT e.iteration FROM episodes e
WHERE e.status = 'scored' AND e.episode_id IN ({_unscored()})"""
    if cfg.algorithm == "aggrevate":
        return f"SELECT iteration FROM ({_aggrevate_parents()}) WHERE NOT complete"
    return "SELECT NULL::BIGINT AS iteration WHERE false"


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
    score part of "v" on v+1), and, for the non-GRPO algorithms, ``$iteration``
    (:func:`step_iteration`) is scheduled and settled (GRPO's unit is the whole group already).
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
    if cfg.algorithm == "grpo":
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
    ep = EPISODE_COLUMN[cfg.algorithm]
    extra = f"AND ({cfg.row_filter})" if cfg.row_filter else ""
    turn = "turn" if cfg.algorithm != "aggrevate" else "turn, action_index"
    return (
        f"SELECT {columns} FROM {cfg.source_view} WHERE list_contains($episode_ids, {ep}) {extra} "
        f"ORDER BY {ep}, {turn}"
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

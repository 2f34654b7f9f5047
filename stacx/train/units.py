"""Readiness and batch selection, in SQL over the log (pure functions that build queries).

A *unit* is what the trainer takes whole or not at all: a GRPO group (its advantages are
relative to each other), or one episode for the other algorithms (a parent episode and its
explored branches for AggreVaTe). :func:`ready_units_sql` lists the units that are

- complete: GRPO, every sample of the group is scored or failed for good (``n_samples`` from
  ``task_scheduled``; without one, the samples seen); otherwise the episode is scored (DAgger:
  ended in any way, since its labels stand whatever the reward);
- not trained on yet: none of their episodes appears in the ``episode_ids`` of a committed
  ``train_step_finished`` (one whose weight version is at most the trainer's);
- fresh enough (GRPO and OPD only; the other algorithms learn off-policy by design): the
  oldest weight version of their turns is at most ``staleness`` versions behind ``version``.
  A turn without a weight version counts as current.

oldest first (by when they became complete), then by id, so a redo picks the same batch.
Rows of the source view that fail the filter are not part of any unit. Every value spliced
into SQL is an integer or comes from the validated config (view names are identifiers).
"""

from __future__ import annotations

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


def _trained(version: int) -> str:
    return (
        "SELECT DISTINCT unnest(episode_ids) AS episode_id FROM train_step_finished "
        f"WHERE weight_version <= {int(version)}"
    )


def _where(cfg: TrainerConfig) -> str:
    return f"WHERE ({cfg.row_filter})" if cfg.row_filter else ""


def ready_units_sql(cfg: TrainerConfig, version: int) -> str:
    """Rows (unit_id, episode_ids, min_version, ready_ts) of the units ready for a step."""
    v = int(version)
    staleness = cfg.staleness_limit if cfg.algorithm in ("grpo", "opd") else None
    fresh = (
        f"AND {v} - coalesce(min(s.min_version), {v}) <= {staleness}"
        if staleness is not None
        else ""
    )
    ep = EPISODE_COLUMN[cfg.algorithm]
    src = (
        f"SELECT {ep} AS episode_id, min(weight_version) AS min_version "
        f"FROM {cfg.source_view} {_where(cfg)} GROUP BY ALL"
    )
    if cfg.algorithm == "grpo":
        return f"""
WITH trained AS ({_trained(v)}),
final_fail AS (
    SELECT DISTINCT episode_id FROM infra_failed WHERE episode_id IS NOT NULL AND NOT will_retry
),
sched AS (SELECT group_id, max(n_samples) AS n_samples FROM task_scheduled GROUP BY group_id),
groups AS (
    SELECT e.group_id,
           count(DISTINCT e.sample_index)
               FILTER (WHERE e.status = 'scored' OR ff.episode_id IS NOT NULL) AS n_done,
           count(DISTINCT e.sample_index) AS n_seen,
           max(e.finished_ts) AS ready_ts
    FROM episodes e LEFT JOIN final_fail ff USING (episode_id)
    GROUP BY e.group_id
),
src AS ({src})
SELECT g.group_id AS unit_id,
       list(DISTINCT s.episode_id ORDER BY s.episode_id) AS episode_ids,
       min(s.min_version) AS min_version,
       max(g.ready_ts) AS ready_ts
FROM src s
JOIN episodes e USING (episode_id)
JOIN groups g ON g.group_id = e.group_id
LEFT JOIN sched sc ON sc.group_id = e.group_id
LEFT JOIN trained t ON t.episode_id = s.episode_id
WHERE g.n_done >= coalesce(sc.n_samples, g.n_seen)
GROUP BY g.group_id
HAVING NOT bool_or(t.episode_id IS NOT NULL) {fresh}
ORDER BY ready_ts, unit_id
"""
    if cfg.algorithm == "aggrevate":
        return f"""
WITH trained AS ({_trained(v)}),
src AS (
    SELECT parent_episode_id, {ep} AS episode_id, max(ts) AS ts
    FROM {cfg.source_view} {_where(cfg)} GROUP BY ALL
)
SELECT s.parent_episode_id AS unit_id,
       list(DISTINCT s.episode_id ORDER BY s.episode_id) AS episode_ids,
       NULL::BIGINT AS min_version,
       max(s.ts) AS ready_ts
FROM src s
JOIN episodes p ON p.episode_id = s.parent_episode_id
LEFT JOIN trained t ON t.episode_id = s.episode_id
WHERE p.status IN ('scored', 'finished', 'failed') AND s.episode_id IS NOT NULL
GROUP BY s.parent_episode_id
HAVING NOT bool_or(t.episode_id IS NOT NULL)
ORDER BY ready_ts, unit_id
"""
    complete = (
        "e.status IN ('scored', 'finished', 'failed')"
        if cfg.algorithm == "dagger"
        else "e.status = 'scored'"
    )
    return f"""
WITH trained AS ({_trained(v)}),
src AS ({src})
SELECT s.episode_id AS unit_id,
       [s.episode_id] AS episode_ids,
       min(s.min_version) AS min_version,
       max(e.finished_ts) AS ready_ts
FROM src s
JOIN episodes e USING (episode_id)
LEFT JOIN trained t ON t.episode_id = s.episode_id
WHERE {complete}
GROUP BY s.episode_id
HAVING NOT bool_or(t.episode_id IS NOT NULL) {fresh}
ORDER BY ready_ts, unit_id
"""


def batch_rows_sql(cfg: TrainerConfig, episode_ids: list[str]) -> str:
    """The source view's rows of the chosen episodes, in a stable order."""
    ep = EPISODE_COLUMN[cfg.algorithm]
    ids = ", ".join("'" + e.replace("'", "''") + "'" for e in episode_ids)
    extra = f"AND ({cfg.row_filter})" if cfg.row_filter else ""
    turn = "turn" if cfg.algorithm != "aggrevate" else "turn, action_index"
    return f"SELECT * FROM {cfg.source_view} WHERE {ep} IN ({ids}) {extra} ORDER BY {ep}, {turn}"


def trainer_state_sql() -> str:
    """One row: the latest committed weight version of this log and its checkpoint path."""
    return (
        "SELECT version, path, sha256 FROM weights_published ORDER BY version DESC, ts DESC LIMIT 1"
    )


def pending_step_sql(version: int) -> str:
    """A train step recorded for the next version whose weights were never published: a crash
    between the two events. Its episode_ids are the batch to redo."""
    v = int(version) + 1
    return (
        f"SELECT episode_ids FROM train_step_finished WHERE weight_version = {v} "
        f"AND {v} NOT IN (SELECT version FROM weights_published) ORDER BY ts DESC LIMIT 1"
    )

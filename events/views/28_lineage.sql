-- lineage: what each weight version was trained on. One row per (train step, episode) from
-- train_step_finished.episode_ids: the version it produced, the episode's task, the weight
-- version that generated the episode, and where the episode came from: source_run_id is the
-- run it was replayed from (from event_imported, for replayed episodes) or this run, and
-- origin_run_id the run that first recorded it (across generations: A -> replay B -> replay C).
CREATE OR REPLACE VIEW lineage AS
WITH steps AS (
    SELECT * FROM train_step_finished
    QUALIFY row_number() OVER (PARTITION BY run_id, step ORDER BY ts DESC, _seq DESC) = 1
), trained AS (
    SELECT run_id, step, algorithm, weight_version, unnest(episode_ids) AS episode_id FROM steps
), origin AS (
    SELECT s.episode_id, s.run_id, i.source_run_id, i.source_event_id,
           coalesce(nullif(i.origin_run_id, ''), i.source_run_id, s.run_id) AS origin_run_id
    FROM episode_started s
    LEFT JOIN event_imported i ON i.imported_event_id = s.event_id
    QUALIFY row_number() OVER (PARTITION BY s.episode_id ORDER BY s._seq) = 1
)
SELECT tr.weight_version,
       tr.step,
       tr.algorithm,
       tr.episode_id,
       e.task_id,
       e.group_id,
       e.reward,
       e.first_weight_version AS episode_weight_version,
       o.source_run_id IS NOT NULL AS imported,
       coalesce(o.source_run_id, o.run_id) AS source_run_id,
       o.origin_run_id,
       tr.run_id
FROM trained tr
LEFT JOIN episodes e USING (episode_id)
LEFT JOIN origin o USING (episode_id);

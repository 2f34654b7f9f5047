-- episode_metrics: every metric a verifier wrote beside its reward (reward.json's other keys,
-- RewardAssigned.metrics_json), one row per scored episode and metric, next to the reward.
-- The MLE tasks (recipes/tasks/mle) write their raw score here: `accuracy` or `rmse`, and
-- `submitted` (0: no submission file). E.g. the raw metric per task:
--   SELECT task_id, metric, avg(value), avg(reward) FROM episode_metrics GROUP BY ALL
CREATE OR REPLACE VIEW episode_metrics AS
SELECT e.episode_id, e.task_id, e.reward, k.metric,
       TRY_CAST(json_extract(e.metrics_json, '$."' || k.metric || '"') AS DOUBLE) AS value
FROM episodes e, unnest(json_keys(e.metrics_json)) AS k(metric)
WHERE e.status = 'scored' AND e.metrics_json IS NOT NULL;

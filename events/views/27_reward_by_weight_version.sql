-- reward_by_weight_version: reward statistics of episodes by the weight version that started
-- them (the first turn's weight_version) and by split (train/eval, from task_scheduled).
-- Only scored episodes count toward rewards; n_infra_failed counts those that failed (never 0s).
-- pass_rate = share of scored episodes with reward >= 1 (a full solve); reward_se and
-- pass_rate_se are the standard errors of the two means.
CREATE OR REPLACE VIEW reward_by_weight_version AS
WITH splits AS (
    SELECT group_id, arg_max(split, ts) AS split FROM task_scheduled GROUP BY group_id
)
SELECT e.first_weight_version AS weight_version,
       coalesce(sp.split, 'train') AS split,
       count(*) FILTER (WHERE e.status = 'scored') AS n_episodes,
       avg(e.reward) FILTER (WHERE e.status = 'scored') AS reward_mean,
       stddev_samp(e.reward) FILTER (WHERE e.status = 'scored') AS reward_std,
       avg(CASE WHEN e.reward >= 1 THEN 1.0 ELSE 0.0 END) FILTER (WHERE e.status = 'scored') AS pass_rate,
       count(*) FILTER (WHERE e.status = 'failed') AS n_infra_failed,
       count(DISTINCT e.task_id) AS n_tasks,
       min(e.started_ts) AS first_ts,
       max(e.finished_ts) AS last_ts,
       reward_std / sqrt(nullif(n_episodes, 0)) AS reward_se,
       sqrt(pass_rate * (1 - pass_rate) / nullif(n_episodes, 0)) AS pass_rate_se
FROM episodes e
LEFT JOIN splits sp USING (group_id)
WHERE e.status IN ('scored', 'failed')
GROUP BY ALL;

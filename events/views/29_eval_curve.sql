-- eval_curve: the periodic eval during training (the recipe's [eval]), one row per evaluated
-- weight version: the version its groups were pinned to (TaskScheduled.weight_version of the
-- role = 'eval' groups), over samples (one per (group, sample index), all attempts folded).
-- Only scored samples count toward rewards; n_infra_failed counts those failed for good.
CREATE OR REPLACE VIEW eval_curve AS
WITH evals AS (
    SELECT group_id, weight_version FROM scheduled_groups WHERE is_eval
)
SELECT v.weight_version,
       count(*) FILTER (WHERE s.scored) AS n_samples,
       avg(s.reward) FILTER (WHERE s.scored) AS reward_mean,
       avg(CASE WHEN s.reward >= 1 THEN 1.0 ELSE 0.0 END) FILTER (WHERE s.scored) AS pass_rate,
       count(*) FILTER (WHERE s.failed) AS n_infra_failed,
       count(*) FILTER (WHERE NOT s.done) AS n_pending,
       count(DISTINCT s.task_id) AS n_tasks
FROM samples s
JOIN evals v USING (group_id)
GROUP BY v.weight_version
ORDER BY v.weight_version;

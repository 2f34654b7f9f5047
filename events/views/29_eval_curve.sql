-- eval_curve: the periodic eval during training (the recipe's [eval]), one row per evaluated
-- weight version: the version its groups were pinned to (TaskScheduled.weight_version of the
-- role = 'eval' groups), over samples (one per (group, sample index), all attempts folded).
-- Only scored samples count toward rewards; n_infra_failed counts those failed for good.
-- pass_rate_se / reward_se: standard errors of the two means (binomial sqrt(p(1-p)/n); sample
-- std / sqrt(n)), so a rise between two versions can be read against its noise (a rise larger
-- than twice sqrt(se_a^2 + se_b^2) is unlikely to be sampling noise).
-- n_off_version: scored samples whose turns did not all come from the pinned version. The
-- engine serves one version at a time: in sync mode the step after v waits for v's eval
-- (stacx.train.units.gate_sql), so this is 0; in async mode an eval still running when the
-- trainer publishes the next version finishes on it (seen on the H200 before the sync gate:
-- 212 of 280 samples of the v0 eval ran on v1); read an async curve against this count.
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
       count(DISTINCT s.task_id) AS n_tasks,
       sqrt(pass_rate * (1 - pass_rate) / nullif(n_samples, 0)) AS pass_rate_se,
       stddev_samp(s.reward) FILTER (WHERE s.scored) / sqrt(nullif(n_samples, 0)) AS reward_se,
       count(*) FILTER (WHERE s.scored AND (e.first_weight_version IS DISTINCT FROM v.weight_version
                                            OR e.last_weight_version IS DISTINCT FROM v.weight_version))
           AS n_off_version
FROM samples s
JOIN evals v USING (group_id)
LEFT JOIN episodes e USING (episode_id)
GROUP BY v.weight_version
ORDER BY v.weight_version;

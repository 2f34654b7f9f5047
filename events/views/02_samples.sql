-- samples: one row per sample (group_id, sample_index) of any policy, over all its attempts.
-- THE definition of "is this sample done" (the scheduler, the trainer's readiness, the rollout
-- manager's resume, the eval report and the progress line all select from here):
--   done = one attempt was scored, or one failed for good (InfraFailed with will_retry = false).
-- episode_id is the scored attempt (else the latest one); n_attempts counts attempts started.
-- A teacher's failure on one visited state (InfraFailed with `turn` set) is not an attempt's.
CREATE OR REPLACE VIEW samples AS
WITH final_fail AS (
    SELECT DISTINCT episode_id FROM infra_failed
    WHERE episode_id IS NOT NULL AND turn IS NULL AND NOT will_retry
)
SELECT e.run_id,
       e.group_id,
       e.sample_index,
       any_value(e.task_id) AS task_id,
       max(e.iteration) AS iteration,
       any_value(e.policy) AS policy,
       bool_or(e.status = 'scored') OR bool_or(ff.episode_id IS NOT NULL) AS done,
       bool_or(e.status = 'scored') AS scored,
       bool_or(ff.episode_id IS NOT NULL) AND NOT bool_or(e.status = 'scored') AS failed,
       arg_max(e.episode_id, (e.status = 'scored', e.started_ts)) AS episode_id,
       max(e.reward) FILTER (WHERE e.status = 'scored') AS reward,
       count(*) AS n_attempts,
       max(e.finished_ts) AS done_ts
FROM episodes e
LEFT JOIN final_fail ff USING (episode_id)
GROUP BY e.run_id, e.group_id, e.sample_index;

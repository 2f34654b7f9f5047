-- attempts: one row per attempt (episode) of a sample: THE per-attempt state the rollout
-- manager resumes from. scored: a reward was assigned; failed: an episode-level InfraFailed
-- (a teacher's failure on one visited state, `turn` set, is not the attempt's); final: one
-- of those failures will not be retried (the sample failed for good).
CREATE OR REPLACE VIEW attempts AS
WITH failures AS (
    SELECT episode_id, bool_or(NOT will_retry) AS final FROM infra_failed
    WHERE episode_id IS NOT NULL AND turn IS NULL GROUP BY episode_id
)
SELECT s.run_id,
       s.group_id,
       s.sample_index,
       s.attempt,
       s.episode_id,
       s.episode_id IN (SELECT episode_id FROM reward_assigned) AS scored,
       f.episode_id IS NOT NULL AS failed,
       coalesce(f.final, false) AS final
FROM (SELECT * FROM episode_started QUALIFY row_number() OVER (PARTITION BY episode_id ORDER BY _seq) = 1) s
LEFT JOIN failures f USING (episode_id);

-- samples: one row per sample (group_id, sample_index) of any policy, over all its attempts.
-- THE definition of "is this sample done" (the scheduler, the trainer's readiness, the eval
-- report and the progress line select from here; the rollout manager resumes from `attempts`):
--   done = one attempt was scored, or one failed for good (attempts.final).
-- episode_id is the scored attempt (else the latest one); n_attempts counts attempts started.
-- A teacher's failure on one visited state (InfraFailed with `turn` set) is not an attempt's.
CREATE OR REPLACE VIEW samples AS
SELECT e.run_id,
       e.group_id,
       e.sample_index,
       any_value(e.task_id) AS task_id,
       max(e.iteration) AS iteration,
       any_value(e.policy) AS policy,
       bool_or(e.status = 'scored') OR bool_or(a.final) AS done,
       bool_or(e.status = 'scored') AS scored,
       bool_or(a.final) AND NOT bool_or(e.status = 'scored') AS failed,
       arg_max(e.episode_id, (e.status = 'scored', e.started_ts)) AS episode_id,
       max(e.reward) FILTER (WHERE e.status = 'scored') AS reward,
       count(*) AS n_attempts,
       max(e.finished_ts) AS done_ts
FROM episodes e
LEFT JOIN attempts a USING (episode_id)
GROUP BY e.run_id, e.group_id, e.sample_index;

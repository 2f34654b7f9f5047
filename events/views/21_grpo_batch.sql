-- grpo_batch: one row per student turn of every scored episode, with its episode's
-- group-normalized advantage (GRPO). The same numbers as stacx.train.advantages.group_advantages:
--   advantage     = reward - avg(reward) over the group
--   advantage_std = advantage / (stddev_samp(reward) over the group + 1e-6)
-- Both are exactly 0 for a group whose rewards are all equal, and for a group of one.
-- Only episodes with status 'scored' take part: an infra-failed episode is never a 0, it is
-- left out of its group (group_size counts the scored episodes; group_failed the failed ones).
-- The group statistics cover every scored episode of the group; rows are student turns only
-- (turns a teacher or oracle produced are not the policy's samples).
-- staleness = (latest published weight version, 0 if none) - weight_version of the turn.
-- behavior_logprobs are the engine's logprobs of output_ids when it sampled them.
CREATE OR REPLACE VIEW grpo_batch AS
WITH scored AS (
    SELECT episode_id, task_id, group_id, iteration, reward,
           count(*) OVER g AS group_size,
           avg(reward) OVER g AS group_mean,
           stddev_samp(reward) OVER g AS group_std,
           min(reward) OVER g = max(reward) OVER g AS group_all_equal
    FROM episodes
    WHERE status = 'scored'
      AND group_id NOT IN (SELECT group_id FROM scheduled_groups WHERE is_eval)  -- a periodic eval's episodes are never training data
    WINDOW g AS (PARTITION BY group_id)
), failed AS (
    SELECT group_id, count(*) AS group_failed FROM episodes WHERE status = 'failed' GROUP BY group_id
), latest AS (
    SELECT coalesce(max(version), 0) AS version FROM weights_published
)
SELECT t.run_id,
       t.episode_id,
       t.turn,
       s.task_id,
       s.group_id,
       s.iteration,
       t.prompt_ids,
       t.chain_turn,
       t.n_prompt_tokens,
       t.output_ids,
       t.logprobs AS behavior_logprobs,
       t.weight_version,
       s.reward,
       s.group_size,
       coalesce(f.group_failed, 0) AS group_failed,
       s.group_mean,
       s.group_std,
       CASE WHEN s.group_all_equal THEN 0.0 ELSE s.reward - s.group_mean END AS advantage,
       CASE WHEN s.group_all_equal THEN 0.0
            ELSE (s.reward - s.group_mean) / (s.group_std + 1e-6) END AS advantage_std,
       latest.version - t.weight_version AS staleness,
       t.ts
FROM turns t
JOIN scored s USING (episode_id)
LEFT JOIN failed f USING (group_id)
CROSS JOIN latest
WHERE t.actor = 'student';

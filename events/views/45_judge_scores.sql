-- judge_scores: every question a judge model was asked about an episode's answer (JudgeScored,
-- stacx.judge), one row per call and attempt, beside the episode's task and its final reward.
--   judge, rubric               the judge engine's name (recipe judge.name) and the rubric file
--   call, attempt               0 in batched mode (the criterion's index in individual mode);
--                               0, then 1.. for re-asks after an engine error or unparseable reply
--   criteria, reply, scores     the criteria asked, the reply as text, what it scored (JSON:
--                               criterion -> normalized score in [0, 1]); error: why not
--   prompt_tokens, output_tokens  lengths of JudgeScored.prompt_ids / output_ids
--   score                       set on the call that completed the judgement: the judge score
--   verifier_reward, judge_score, reward   the episode's RewardAssigned parts (metrics_json)
--                               and its reward: the rubric's [combine] of the two
-- A judgement that failed leaves calls with `error` set and no reward: the episode's
-- InfraFailed (failure_kind 'judge') says so; it is never scored 0.
CREATE OR REPLACE VIEW judge_scores AS
WITH rewards AS (
    SELECT episode_id, arg_max(reward, ts) AS reward, arg_max(metrics_json, ts) AS metrics_json
    FROM reward_assigned GROUP BY episode_id
)
SELECT j.episode_id,
       s.task_id,
       j.judge,
       j.rubric,
       j.call,
       j.attempt,
       j.criteria,
       j.reply,
       j.scores_json AS scores,
       j.error,
       j.score,
       len(j.prompt_ids) AS prompt_tokens,
       len(j.output_ids) AS output_tokens,
       j.gen_ms,
       TRY_CAST(r.metrics_json->>'verifier_reward' AS DOUBLE) AS verifier_reward,
       TRY_CAST(r.metrics_json->>'judge' AS DOUBLE) AS judge_score,
       r.reward,
       j.ts
FROM judge_scored j
LEFT JOIN (SELECT episode_id, any_value(task_id) AS task_id FROM episode_started
           GROUP BY episode_id) s USING (episode_id)
LEFT JOIN rewards r USING (episode_id);

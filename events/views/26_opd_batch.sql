-- opd_batch: on-policy distillation. One row per student turn that the teacher scored: the
-- student's sampled output_ids with its own logprobs, the teacher's logprobs of the same ids on
-- the identical prompt ids, and per token
--   advantages[i] = teacher_logprobs[i] - student_logprobs[i]   (negative reverse-KL estimate)
-- loss_mask covers output_ids (all assistant tokens: 1). aligned is false when the two logprob
-- arrays disagree in length with output_ids; advantages is then NULL (never trained on).
-- grpo_advantage (NULL unless the episode is scored) lets a trainer mix in the GRPO advantage.
CREATE OR REPLACE VIEW opd_batch AS
WITH scored AS (
    SELECT * FROM teacher_scored
    QUALIFY row_number() OVER (PARTITION BY episode_id, turn, teacher ORDER BY ts DESC, _seq DESC) = 1
)
SELECT t.run_id,
       t.episode_id,
       t.turn,
       e.task_id,
       e.group_id,
       s.teacher,
       t.prompt_ids,
       t.chain_turn,
       t.n_prompt_tokens,
       t.output_ids,
       t.logprobs AS student_logprobs,
       s.teacher_logprobs,
       len(s.teacher_logprobs) = len(t.output_ids) AND len(t.logprobs) = len(t.output_ids) AS aligned,
       CASE WHEN len(s.teacher_logprobs) = len(t.output_ids) AND len(t.logprobs) = len(t.output_ids)
            THEN [p[1] - p[2] for p in list_zip(s.teacher_logprobs, t.logprobs)] END AS advantages,
       [1 for _x in t.output_ids] AS loss_mask,
       t.weight_version,
       g.advantage AS grpo_advantage,
       e.reward,
       t.ts
FROM turns t
JOIN scored s USING (episode_id, turn)
LEFT JOIN episodes e ON e.episode_id = t.episode_id
LEFT JOIN grpo_batch g ON g.episode_id = t.episode_id AND g.turn = t.turn
WHERE t.actor = 'student'
  AND (e.group_id IS NULL OR e.group_id NOT IN (SELECT group_id FROM scheduled_groups WHERE is_eval));  -- never a periodic eval's turns

-- dagger_dataset: DAgger's aggregated dataset — every teacher label ever recorded (the union over
-- all iterations; with `stacx sql` over several runs, over those runs too), one row per label.
-- prompt_ids are the exact ids the student saw at the visited state; completion_ids are the
-- teacher's label; loss_mask covers completion_ids (the label: all 1).
-- The visited turn's context rides along: student_output_ids is the action that was executed
-- (the environment always advanced with it, never with the label), actor who executed it,
-- prompt_matches whether the label was made on the identical prompt ids (it must be).
-- chain_turn, n_prompt_tokens: the visited turn's prompt in turn_chains (the trainer's read),
-- NULL unless prompt_matches (a label made on other ids has no place in the chain).
CREATE OR REPLACE VIEW dagger_dataset AS
SELECT l.run_id,
       l.episode_id,
       l.turn,
       l.iteration,
       l.teacher,
       e.task_id,
       e.group_id,
       l.prompt_ids,
       CASE WHEN t.prompt_ids = l.prompt_ids THEN t.chain_turn END AS chain_turn,
       CASE WHEN t.prompt_ids = l.prompt_ids THEN t.n_prompt_tokens END AS n_prompt_tokens,
       l.label_ids AS completion_ids,
       [1 for _x in l.label_ids] AS loss_mask,
       l.logprobs AS teacher_logprobs,
       t.output_ids AS student_output_ids,
       t.actor,
       t.weight_version,
       t.prompt_ids = l.prompt_ids AS prompt_matches,
       e.status,
       e.reward,
       l.ts
FROM teacher_labeled l
LEFT JOIN turns t USING (episode_id, turn)
LEFT JOIN episodes e ON e.episode_id = l.episode_id;

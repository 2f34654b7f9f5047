-- sft_examples: one row per (episode, turn) of any actor, ready for supervised fine-tuning.
-- prompt_ids are the exact ids the engine saw; completion_ids = output_ids (never re-tokenized).
-- loss_mask covers completion_ids (one 0/1 per completion id: here all 1; the prompt is never
-- trained on). chain_turn, n_prompt_tokens: the row's prompt in turn_chains (the trainer's
-- packed read, which leaves prompt_ids out).
-- Filter with WHERE, e.g. `select * from sft_examples where reward > 0 and actor = 'oracle'`.
-- reward is NULL unless the episode was scored (status = 'scored'); infra-failed episodes keep
-- reward NULL and status 'failed' (never a 0).
CREATE OR REPLACE VIEW sft_examples AS
SELECT t.run_id,
       t.episode_id,
       e.task_id,
       e.group_id,
       e.iteration,
       t.turn,
       t.actor,
       t.weight_version,
       t.prompt_ids,
       t.output_ids AS completion_ids,
       [1 for _x in t.output_ids] AS loss_mask,
       t.chain_turn,
       t.n_prompt_tokens,
       e.status,
       e.reward,
       t.ts
FROM turns t
LEFT JOIN episodes e USING (episode_id)
-- a periodic eval's episodes (TaskScheduled.role = 'eval') are never training data
WHERE e.group_id IS NULL OR e.group_id NOT IN (SELECT group_id FROM scheduled_groups WHERE is_eval);

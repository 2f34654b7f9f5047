-- aggrevate_dataset: AggreVaTe's cost-sensitive data. One row per explored branch: the state is
-- (parent_episode_id, turn); the action is the learner's exploration turn of the branch episode
-- (branch_created.episode_id at `turn`); Q = cost (cost-to-go, 1 - reward, teacher finished it).
--   advantage = -(Q - avg(Q) over the state's explored actions)
-- so cheaper-than-average actions get a positive advantage; exactly 0 when every action of the
-- state has the same cost, or when only one action was explored. Branches dropped for
-- non-determinism have no cost row and are absent.
CREATE OR REPLACE VIEW aggrevate_dataset AS
WITH costs AS (
    SELECT * FROM cost_to_go_estimated
    QUALIFY row_number() OVER (PARTITION BY branch_id ORDER BY ts DESC, _seq DESC) = 1
), q AS (
    SELECT *,
           count(*) OVER s AS n_actions,
           avg(cost) OVER s AS q_mean,
           min(cost) OVER s = max(cost) OVER s AS all_equal
    FROM costs
    WINDOW s AS (PARTITION BY parent_episode_id, turn)
)
SELECT q.run_id,
       q.parent_episode_id,
       q.turn,
       q.action_index,
       q.branch_id,
       b.episode_id AS branch_episode_id,
       q.iteration,
       pe.task_id,
       t.prompt_ids,
       t.chain_turn,
       t.n_prompt_tokens,
       t.output_ids AS action_ids,
       t.logprobs AS behavior_logprobs,
       t.actor,
       q.cost AS q,
       q.reward,
       q.n_actions,
       q.q_mean,
       CASE WHEN q.all_equal THEN 0.0 ELSE -(q.cost - q.q_mean) END AS advantage,
       q.ts
FROM q
LEFT JOIN branch_created b ON b.branch_id = q.branch_id
LEFT JOIN turns t ON t.episode_id = b.episode_id AND t.turn = q.turn
LEFT JOIN episodes pe ON pe.episode_id = q.parent_episode_id;

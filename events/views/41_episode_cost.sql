-- episode_cost: what each episode cost, one row per episode, from timing fields the events carry.
--   generated_tokens, prompt_tokens   output ids of its turns; whole prompts the engine was given
--                                     (before any prefix cache: an upper bound on prefill work)
--   engine_ms, queue_ms               TurnGenerated.gen_ms (the engine generating its turns) and
--                                     queue_ms (waiting for an engine slot), summed over turns
--   sandbox_start_ms                  SandboxStarted.start_ms (a warm pool's wait, else the start)
--   tool_ms                           ToolReturned.duration_ms: its commands running in the sandbox
--   verifier_ms                       RewardAssigned.verifier_ms (the verifier's run)
--   sandbox_ms                        sandbox_start_ms + tool_ms + verifier_ms
--   sandbox_alive_s                   SandboxStopped.ts - SandboxStarted.ts (held, busy or idle)
--   trainer_ms                        an ESTIMATE: each train step that trained on the episode
--                                     (TrainStepFinished.episode_ids) shares its duration_ms among
--                                     its episodes by their generated tokens (the step does not
--                                     record per-episode tokens); summed over steps (epochs)
--   n_train_steps                     how many steps trained on it
--   wall_s                            finished_ts - started_ts of the episode
-- Episodes of every status are listed (an infra-failed episode cost time too).
CREATE OR REPLACE VIEW episode_cost AS
WITH gen AS (
    SELECT episode_id, count(*) AS n_turns, sum(len(output_ids)) AS generated_tokens,
           sum(gen_ms) AS engine_ms, sum(queue_ms) AS queue_ms
    FROM turn_generated GROUP BY episode_id
), prompts AS (
    SELECT episode_id, sum(n_prompt_tokens) AS prompt_tokens FROM turns GROUP BY episode_id
), tools AS (
    SELECT episode_id, sum(duration_ms) AS tool_ms, count(*) AS n_tool_calls
    FROM tool_returned GROUP BY episode_id
), boxes AS (
    SELECT s.episode_id, sum(s.start_ms) AS sandbox_start_ms, sum(p.ts - s.ts) AS sandbox_alive_s
    FROM sandbox_started s LEFT JOIN sandbox_stopped p USING (sandbox_id)
    WHERE s.episode_id IS NOT NULL GROUP BY s.episode_id
), verify AS (
    SELECT episode_id, sum(verifier_ms) AS verifier_ms FROM reward_assigned GROUP BY episode_id
), steps AS (
    SELECT * FROM train_step_finished
    QUALIFY row_number() OVER (PARTITION BY run_id, step ORDER BY ts DESC, _seq DESC) = 1
), trained AS (
    SELECT s.run_id, s.step, s.duration_ms, unnest(s.episode_ids) AS episode_id FROM steps s
), shares AS (
    SELECT t.episode_id, t.step, t.duration_ms,
           coalesce(g.generated_tokens, 0) AS tokens,
           sum(coalesce(g.generated_tokens, 0)) OVER (PARTITION BY t.run_id, t.step) AS step_tokens,
           count(*) OVER (PARTITION BY t.run_id, t.step) AS step_episodes
    FROM trained t LEFT JOIN gen g USING (episode_id)
), trainer AS (
    SELECT episode_id,
           sum(CASE WHEN step_tokens > 0 THEN duration_ms * tokens / step_tokens
                    ELSE duration_ms / step_episodes END) AS trainer_ms,
           count(DISTINCT step) AS n_train_steps
    FROM shares GROUP BY episode_id
)
SELECT e.run_id,
       e.episode_id,
       e.task_id,
       e.agent,
       e.status,
       e.reward,
       coalesce(g.n_turns, 0) AS n_turns,
       coalesce(g.generated_tokens, 0) AS generated_tokens,
       coalesce(p.prompt_tokens, 0) AS prompt_tokens,
       coalesce(g.engine_ms, 0) AS engine_ms,
       coalesce(g.queue_ms, 0) AS queue_ms,
       coalesce(b.sandbox_start_ms, 0) AS sandbox_start_ms,
       coalesce(t.tool_ms, 0) AS tool_ms,
       coalesce(v.verifier_ms, 0) AS verifier_ms,
       coalesce(b.sandbox_start_ms, 0) + coalesce(t.tool_ms, 0) + coalesce(v.verifier_ms, 0) AS sandbox_ms,
       b.sandbox_alive_s,
       coalesce(tr.trainer_ms, 0) AS trainer_ms,
       coalesce(tr.n_train_steps, 0) AS n_train_steps,
       e.finished_ts - e.started_ts AS wall_s
FROM episodes e
LEFT JOIN gen g USING (episode_id)
LEFT JOIN prompts p USING (episode_id)
LEFT JOIN tools t USING (episode_id)
LEFT JOIN boxes b USING (episode_id)
LEFT JOIN verify v USING (episode_id)
LEFT JOIN trainer tr USING (episode_id);

-- tasks_lost: THE definition of "task lost for good": a task that failed as a whole
-- (InfraFailed with its task_id and no episode, will_retry false: e.g. its files are
-- unreadable). Its groups are not waited for (the scheduler, the trainer's readiness).
CREATE OR REPLACE VIEW tasks_lost AS
SELECT DISTINCT task_id FROM infra_failed
WHERE episode_id IS NULL AND task_id IS NOT NULL AND NOT will_retry;

-- scheduled_groups: one row per scheduled group (TaskScheduled, the latest values).
-- is_eval: THE definition of an "eval group": a periodic eval during training
-- (TaskScheduled.role = 'eval', the recipe's [eval]; read through to_json so that a log older
-- than that field still loads). Its samples measure a weight version: never training data,
-- not a rollout iteration. An eval RUN's groups (split = 'eval', `stacx eval`) are not eval
-- groups: their episodes (e.g. an oracle's demonstrations) may be trained on.
-- lost: its task is in tasks_lost.
CREATE OR REPLACE VIEW scheduled_groups AS
SELECT g.*, g.task_id IN (SELECT task_id FROM tasks_lost) AS lost
FROM (
    SELECT group_id,
           any_value(task_id) AS task_id,
           max(n_samples) AS n_samples,
           max(iteration) AS iteration,
           -- read through to_json, like role: a log older than the field (opened read-only)
           -- still loads this view and the ones built on it (episodes, samples)
           max(TRY_CAST(to_json(t)->>'weight_version' AS BIGINT)) AS weight_version,
           arg_max(split, ts) AS split,
           bool_or(coalesce(to_json(t)->>'role', '') = 'eval') AS is_eval
    FROM task_scheduled t GROUP BY group_id
) g;

-- episodes: one row per episode (a contract for users' SQL; see events/README.md).
-- reward, metrics_json, grader: the latest grade ('rollout': the run's own verifier; else the
-- grader `stacx regrade` recorded).
-- status: 'scored' (a reward was assigned), 'failed' (an infrastructure failure and no reward;
-- never a 0), 'finished' (the agent stopped, not yet scored), 'running'.
CREATE OR REPLACE VIEW episodes AS
WITH turn_stats AS (
    SELECT episode_id,
           count(*) AS n_turns,
           arg_min(weight_version, turn) AS first_weight_version,
           arg_max(weight_version, turn) AS last_weight_version
    FROM turn_generated GROUP BY episode_id
), tool_stats AS (
    SELECT episode_id, count(*) AS n_tool_calls FROM tool_called GROUP BY episode_id
), rewards AS (
    -- the latest grade (stacx regrade appends grades; `grades` lists them all). grader is read
    -- through to_json, so a log older than the field (opened read-only) still loads the view
    SELECT episode_id, arg_max(reward, ts) AS reward, arg_max(metrics_json, ts) AS metrics_json,
           arg_max(coalesce(nullif(to_json(r)->>'grader', ''), 'rollout'), ts) AS grader
    FROM reward_assigned r GROUP BY episode_id
), finished AS (
    SELECT episode_id, arg_max(stop_reason, ts) AS stop_reason, max(ts) AS ts
    FROM episode_finished GROUP BY episode_id
), failures AS (
    SELECT episode_id, arg_max(failure_kind, ts) AS failure_kind, max(ts) AS ts
    -- episode-level failures only: a teacher's failure on one visited state (turn set) leaves
    -- the episode itself intact
    FROM infra_failed WHERE episode_id IS NOT NULL AND turn IS NULL GROUP BY episode_id
)
SELECT s.episode_id,
       s.run_id,
       s.task_id,
       s.group_id,
       s.sample_index,
       s.iteration,
       s.agent,
       s.policy,
       CASE WHEN r.episode_id IS NOT NULL THEN 'scored'
            WHEN x.episode_id IS NOT NULL THEN 'failed'
            WHEN f.episode_id IS NOT NULL THEN 'finished'
            ELSE 'running' END AS status,
       f.stop_reason,
       r.reward,
       r.metrics_json,
       x.failure_kind,
       coalesce(t.n_turns, 0) AS n_turns,
       coalesce(c.n_tool_calls, 0) AS n_tool_calls,
       t.first_weight_version,
       t.last_weight_version,
       s.ts AS started_ts,
       greatest(f.ts, x.ts) AS finished_ts,
       CASE WHEN g.is_eval THEN 'eval' ELSE 'train' END AS role,
       coalesce(g.split, 'train') AS split,
       t.first_weight_version AS weight_version,
       r.grader
FROM (SELECT * FROM episode_started QUALIFY row_number() OVER (PARTITION BY episode_id ORDER BY _seq) = 1) s
LEFT JOIN turn_stats t USING (episode_id)
LEFT JOIN tool_stats c USING (episode_id)
LEFT JOIN rewards r USING (episode_id)
LEFT JOIN finished f USING (episode_id)
LEFT JOIN failures x USING (episode_id)
LEFT JOIN scheduled_groups g ON g.group_id = s.group_id;

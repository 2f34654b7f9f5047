-- gateway_episodes: one row per episode whose turns the model gateway recorded (installed
-- scaffolds: turns.engine = 'gateway:<backend>'): how often the scaffold's calls did not extend
-- the episode's previous call token-exactly, and how many segments the episode has.
--   n_calls         the gateway calls (turns) of the episode
--   n_not_extending calls whose whole prompt does not start with the previous call's prompt +
--                   output, id for id (a summarized or rewritten history, a dropped reply, a
--                   sub-agent); the first call has no previous one and is never counted
--   n_segments      distinct segments (the gateway starts one when a prompt extends no earlier call)
-- Computed from the ids (turns rebuilds whole prompts), not from how the recorder stored them.
CREATE OR REPLACE VIEW gateway_episodes AS
WITH calls AS (
    SELECT run_id, episode_id, turn, segment, prompt_ids,
           lag(list_concat(prompt_ids, output_ids)) OVER (PARTITION BY run_id, episode_id ORDER BY turn) AS previous
    FROM turns
    WHERE engine LIKE 'gateway:%'
)
SELECT c.run_id,
       c.episode_id,
       -- the scaffold's own name (its spec's, from ScaffoldExited), not the agent kind 'installed'
       coalesce(x.scaffold, e.agent) AS scaffold,
       e.task_id,
       count(*) AS n_calls,
       count(*) FILTER (WHERE c.previous IS NOT NULL
                          AND (len(c.prompt_ids) < len(c.previous)
                               OR c.prompt_ids[1:len(c.previous)] <> c.previous)) AS n_not_extending,
       count(DISTINCT c.segment) AS n_segments,
       e.reward
FROM calls c
LEFT JOIN episodes e USING (episode_id)
LEFT JOIN (SELECT episode_id, any_value(scaffold) AS scaffold FROM scaffold_exited GROUP BY 1) x USING (episode_id)
GROUP BY c.run_id, c.episode_id, coalesce(x.scaffold, e.agent), e.task_id, e.reward;

-- gateway_drift: per run and scaffold, the share of gateway calls (those with a previous call
-- in their episode) that did not extend it token-exactly, and segments per episode.
CREATE OR REPLACE VIEW gateway_drift AS
SELECT run_id,
       scaffold,
       count(*) AS n_episodes,
       sum(n_calls) AS n_calls,
       sum(n_not_extending) AS n_not_extending,
       sum(n_not_extending) / nullif(sum(n_calls) - count(*), 0) AS not_extending_rate,
       avg(n_segments) AS segments_per_episode,
       max(n_segments) AS max_segments
FROM gateway_episodes
GROUP BY run_id, scaffold;

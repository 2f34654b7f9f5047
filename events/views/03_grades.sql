-- grades: every reward each episode was given, oldest first: the run's own verifier at rollout
-- (grader 'rollout') and each `stacx regrade` (grader: e.g. 'verifier:<tests dir>@<digest>').
-- latest: the grade `episodes.reward` shows (the newest by ts). Episodes a regrade replayed but
-- did not grade (a divergence, not replayable, infra) are in table episode_not_regraded.
CREATE OR REPLACE VIEW grades AS
SELECT r.run_id,
       r.episode_id,
       e.task_id,
       coalesce(nullif(to_json(r)->>'grader', ''), 'rollout') AS grader,
       r.reward,
       r.metrics_json,
       r.ts,
       row_number() OVER (PARTITION BY r.episode_id ORDER BY r.ts DESC, r._seq DESC) = 1 AS latest,
       r.verifier_ms,
       r.verifier_output
FROM reward_assigned r
LEFT JOIN (SELECT episode_id, any_value(task_id) AS task_id FROM episode_started GROUP BY 1) e
    USING (episode_id);

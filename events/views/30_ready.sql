-- Readiness: one view per kind of training unit (stacx.train.algorithms: each algorithm names
-- its view and the predicate over it that says "complete"). A *unit* is what the trainer takes
-- whole or not at all. Every view has the same columns:
--   unit_id     the unit (a group, an episode, a parent episode)
--   episode_id  the key a source row joins on (the algorithm's unit_key column of its view)
--   iteration   the rollout iteration the unit belongs to
--   ready_ts    when it became complete (NULL: the latest of its source rows' ts)
--   done        its rollouts ended (a done unit that is not complete waits for a signal)
-- plus the signals its algorithm's predicate reads. stacx.train.units joins a source view's
-- filtered rows to one of these; the scheduler and the trainer read the same query.

-- ready_groups: GRPO/RLOO's unit, a group: complete when every scheduled sample is done.
CREATE OR REPLACE VIEW ready_groups AS
WITH groups AS (
    SELECT group_id, max(iteration) AS iteration,
           count(*) FILTER (WHERE done) AS n_done, count(*) AS n_seen, max(done_ts) AS ready_ts
    FROM samples GROUP BY group_id
)
SELECT g.group_id AS unit_id,
       e.episode_id,
       g.iteration,
       g.ready_ts,
       g.n_done >= coalesce(sc.n_samples, g.n_seen) AS done,
       g.n_done >= coalesce(sc.n_samples, g.n_seen) AS complete
FROM episodes e
JOIN groups g ON g.group_id = e.group_id
LEFT JOIN scheduled_groups sc ON sc.group_id = e.group_id;

-- roll_in_turns: the turns of roll-in episodes (EpisodeStarted.policy student or mixture), with
-- whether the teacher labeled / scored each, or a teacher failure (InfraFailed at that turn)
-- was recorded: the signals DAgger's and OPD's units wait for.
CREATE OR REPLACE VIEW roll_in_turns AS
SELECT t.episode_id,
       t.turn,
       CAST(t.actor AS VARCHAR) AS actor,
       len(t.output_ids) AS n_output,
       EXISTS (SELECT 1 FROM teacher_labeled l WHERE l.episode_id = t.episode_id AND l.turn = t.turn)
           AS labeled,
       EXISTS (SELECT 1 FROM teacher_scored x WHERE x.episode_id = t.episode_id AND x.turn = t.turn)
           AS scored,
       EXISTS (SELECT 1 FROM infra_failed f WHERE f.episode_id = t.episode_id AND f.turn = t.turn)
           AS failed
FROM turn_generated t
WHERE t.episode_id IN (SELECT DISTINCT episode_id FROM episode_started
                       WHERE CAST(policy AS VARCHAR) IN ('student', 'mixture'));

-- ready_episodes: SFT's unit, an episode. done: it ended (scored, finished or failed); scored:
-- it has a reward.
CREATE OR REPLACE VIEW ready_episodes AS
SELECT e.episode_id AS unit_id,
       e.episode_id,
       e.iteration,
       e.finished_ts AS ready_ts,
       e.status IN ('scored', 'finished', 'failed') AS done,
       e.status = 'scored' AS scored
FROM episodes e;

-- ready_roll_ins: DAgger's and OPD's unit, an episode, as ready_episodes, with its signals:
-- unlabeled_actors, the actors of its roll-in turns still waiting for a teacher label
-- (DAgger's predicate binds $label_actors against it); unscored, its student turns with
-- output still waiting for a teacher score (OPD).
CREATE OR REPLACE VIEW ready_roll_ins AS
WITH waiting AS (
    SELECT episode_id,
           list(DISTINCT actor) FILTER (WHERE NOT labeled AND NOT failed) AS unlabeled_actors,
           count(*) FILTER (WHERE actor = 'student' AND n_output > 0 AND NOT scored AND NOT failed)
               AS unscored
    FROM roll_in_turns GROUP BY episode_id
)
SELECT e.*,
       coalesce(w.unlabeled_actors, []) AS unlabeled_actors,
       coalesce(w.unscored, 0) AS unscored
FROM ready_episodes e
LEFT JOIN waiting w USING (episode_id);

-- ready_parents: AggreVaTe's unit, a scored roll-in parent episode (joined on the source's
-- parent_episode_id): n_turns its turns (a parent without turns has no branch to wait for),
-- n_outcomes its branches with a CostToGoEstimated or an InfraFailed (predicate: >= $branches).
CREATE OR REPLACE VIEW ready_parents AS
SELECT p.episode_id AS unit_id,
       p.episode_id,
       p.iteration,
       NULL::DOUBLE AS ready_ts,
       true AS done,
       p.n_turns,
       (SELECT count(*) FROM branch_created b WHERE b.parent_episode_id = p.episode_id AND (
          EXISTS (SELECT 1 FROM cost_to_go_estimated c WHERE c.branch_id = b.branch_id)
          OR EXISTS (SELECT 1 FROM infra_failed f WHERE f.episode_id = b.episode_id))
       ) AS n_outcomes
FROM episodes p
WHERE p.status = 'scored'
  AND p.episode_id IN (SELECT DISTINCT episode_id FROM episode_started
                       WHERE CAST(policy AS VARCHAR) IN ('student', 'mixture'));

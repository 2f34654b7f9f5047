-- Per-token weight versions: which policy produced each output token of a turn.
--
-- A turn generated across a weight load records its version change points
-- (TurnGenerated.version_starts / versions: output_ids[version_starts[i]:] came from versions[i]
-- up to the next start); empty (a turn one version produced, and every log older than the
-- fields) means every token is the turn's weight_version.
--
-- turn_versions: one row per turn: token_versions (one version per output id), min_version /
--   max_version (the oldest / newest policy among its tokens), n_tokens.
-- batch_token_versions: per train step and per version, the output tokens of the student turns
--   of the episodes the step trained on (train_step_finished.episode_ids), with behind =
--   the trainer's version when it stepped (step - 1) - version. "How many tokens of step 5's
--   batch came from a policy older than 3":
--     select sum(n_tokens) from batch_token_versions where step = 5 and version < 3
CREATE OR REPLACE VIEW turn_versions AS
WITH stored AS (
    -- UNION BY NAME: a log older than the fields reads them as NULL (-> [])
    SELECT * REPLACE (coalesce(version_starts, []) AS version_starts, coalesce(versions, []) AS versions)
    FROM (SELECT * FROM turn_generated
          UNION ALL BY NAME SELECT NULL::BIGINT[] AS version_starts, NULL::BIGINT[] AS versions WHERE false)
)
SELECT run_id,
       episode_id,
       turn,
       actor,
       weight_version,
       len(output_ids) AS n_tokens,
       version_starts,
       versions,
       CASE WHEN len(versions) = 0
            THEN list_transform(range(len(output_ids)), lambda i: weight_version)
            ELSE list_transform(range(len(output_ids)),
                                lambda i: versions[len(list_filter(version_starts, lambda s: s <= i))])
       END AS token_versions,
       coalesce(list_min(versions), weight_version) AS min_version,
       coalesce(list_max(versions), weight_version) AS max_version,
       ts
FROM stored;

CREATE OR REPLACE VIEW batch_token_versions AS
WITH steps AS (
    SELECT step, episode_ids FROM train_step_finished
    QUALIFY row_number() OVER (PARTITION BY run_id, step ORDER BY ts DESC, _seq DESC) = 1
), chosen AS (
    SELECT step, unnest(episode_ids) AS episode_id FROM steps
), tokens AS (
    SELECT c.step, unnest(t.token_versions) AS version
    FROM chosen c JOIN turn_versions t USING (episode_id)
    WHERE t.actor = 'student'
)
SELECT step, version, (step - 1) - version AS behind, count(*) AS n_tokens
FROM tokens
GROUP BY ALL
ORDER BY step, version;

-- trainer_cadence: per train step, the trainer's own time around the step, to compare with the
-- step itself (issue 28's goal: the trainer's time between two steps <= 1.2x the step).
--   step_s       the optimizer step (TrainStepFinished.duration_ms)
--   batch_s      reading its batch (SQL + samples), before the step
--   hold_s       from the step's end to its publish: snapshot, in-memory handoff, and a checkpoint
--                written before publishing (a background write is not in it; older logs:
--                checkpoint_ms, the write that then sat there)
--   cycle_s      batch_s + step_s + hold_s: one step's time on the trainer's path, i.e. the time
--                between two steps' starts when batches are ready
--   cycle_over_step  cycle_s / step_s (the goal: <= 1.2)
--   gap_s        wall time from the previous step's publish to this one's (also includes
--                waiting for rollouts: in sync mode, the next iteration's)
--   durable      whether the version's checkpoint was on disk when published
--   write_s      the version's checkpoint write (CheckpointSaved), wherever it ran
-- trainer_cadence_run: the same summed over the run (medians of the ratios).
CREATE OR REPLACE VIEW trainer_cadence AS
WITH steps AS (
    SELECT step,
           ts,
           duration_ms / 1000.0 AS step_s,
           coalesce(try_cast(json_extract(metrics_json, '$.batch_ms') AS DOUBLE), 0) / 1000.0 AS batch_s,
           coalesce(try_cast(json_extract(metrics_json, '$.hold_ms') AS DOUBLE),
                    try_cast(json_extract(metrics_json, '$.checkpoint_ms') AS DOUBLE), 0) / 1000.0 AS hold_s
    FROM train_step_finished
    QUALIFY row_number() OVER (PARTITION BY step ORDER BY ts) = 1
), published AS (
    SELECT version, min(ts) AS ts, bool_and(coalesce(durable, true)) AS durable
    FROM weights_published GROUP BY version
), written AS (
    SELECT version, min(duration_ms) / 1000.0 AS write_s FROM checkpoint_saved GROUP BY version
)
SELECT s.step,
       s.step_s,
       s.batch_s,
       s.hold_s,
       s.batch_s + s.step_s + s.hold_s AS cycle_s,
       (s.batch_s + s.step_s + s.hold_s) / nullif(s.step_s, 0) AS cycle_over_step,
       p.ts - lag(p.ts) OVER (ORDER BY s.step) AS gap_s,
       p.durable,
       w.write_s
FROM steps s
LEFT JOIN published p ON p.version = s.step
LEFT JOIN written w ON w.version = s.step
ORDER BY s.step;

CREATE OR REPLACE VIEW trainer_cadence_run AS
SELECT count(*) AS steps,
       sum(step_s) AS step_s,
       sum(batch_s) AS batch_s,
       sum(hold_s) AS hold_s,
       sum(cycle_s) / nullif(sum(step_s), 0) AS cycle_over_step,
       median(cycle_over_step) AS median_cycle_over_step,
       count(*) FILTER (WHERE durable) AS durable_versions,
       sum(write_s) AS write_s
FROM trainer_cadence;

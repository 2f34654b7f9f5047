-- Where the time goes: busy and idle time of the engine, the trainer and the sandboxes, per
-- weight version and per role, from the timing fields the roles already publish.
--
-- busy_intervals: one row per unit of work, [t0, t1] in unix seconds (the event's ts is its end):
--   engine      a generated turn: [ts - gen_ms, ts] (rows of one batch overlap; tokens = its output ids)
--   trainer     a step, from reading its batch to its publish: [ts - batch - step - hold, ts] (hold:
--               snapshot, handoff and a checkpoint written before publishing; older logs: checkpoint_ms)
--   checkpoint  a checkpoint write (CheckpointSaved: [ts - duration_ms, ts], in the background or
--               not; older logs: TrainStepFinished's checkpoint_ms, a part of the trainer's interval)
--   sandbox     a tool run (ToolReturned.duration_ms) or a verifier run (RewardAssigned.verifier_ms)
-- version_windows: weight version v "is current" from its publish (v0: the run's start) to the
--   next publish (the last: the log's last event, or the run's finish or last unit of work).
-- time_accounting: per (weight_version, role): window_s, busy_s = the union of the role's
--   intervals clipped to the window (at least one unit busy), idle_s = window_s - busy_s,
--   busy_frac, work_s = the sum of the clipped intervals (sandbox-seconds: concurrent sandboxes
--   add up), n = intervals ending in the window, tokens (engine: output ids of turns ending in
--   the window) and tokens_per_s = tokens / window_s.
-- time_accounting_run: the same per role over the whole run (first event to last).
-- Limits: a turn's gen_ms is the engine time of its request (prefill and decode steps, shared
-- with the rows of its batch), so engine busy means "some request in flight", not GPU occupancy.
CREATE OR REPLACE VIEW busy_intervals AS
SELECT 'engine' AS role, ts - gen_ms / 1000.0 AS t0, ts AS t1, len(output_ids) AS tokens
FROM turn_generated WHERE gen_ms > 0
UNION ALL
SELECT 'trainer', ts - (duration_ms + coalesce(try_cast(json_extract(metrics_json, '$.batch_ms') AS DOUBLE), 0)
                        + coalesce(try_cast(json_extract(metrics_json, '$.hold_ms') AS DOUBLE),
                                   try_cast(json_extract(metrics_json, '$.checkpoint_ms') AS DOUBLE), 0)) / 1000.0,
       ts, 0
FROM train_step_finished WHERE duration_ms > 0
UNION ALL
SELECT 'checkpoint', ts - duration_ms / 1000.0, ts, 0 FROM checkpoint_saved WHERE duration_ms > 0
UNION ALL
SELECT 'checkpoint', ts - try_cast(json_extract(metrics_json, '$.checkpoint_ms') AS DOUBLE) / 1000.0, ts, 0
FROM train_step_finished
WHERE try_cast(json_extract(metrics_json, '$.checkpoint_ms') AS DOUBLE) > 0
  AND json_extract(metrics_json, '$.hold_ms') IS NULL  -- older logs (no CheckpointSaved)
UNION ALL
SELECT 'sandbox', ts - duration_ms / 1000.0, ts, 0 FROM tool_returned WHERE duration_ms > 0
UNION ALL
SELECT 'sandbox', ts - verifier_ms / 1000.0, ts, 0 FROM reward_assigned WHERE verifier_ms > 0;

CREATE OR REPLACE VIEW version_windows AS
WITH starts AS (
    SELECT 0 AS weight_version, min(ts) AS t0 FROM run_started
    UNION ALL
    SELECT version, min(ts) FROM weights_published GROUP BY version
), firsts AS (
    SELECT weight_version, min(t0) AS t0 FROM starts WHERE t0 IS NOT NULL GROUP BY weight_version
)
SELECT weight_version,
       t0,
       coalesce(lead(t0) OVER (ORDER BY weight_version),
                (SELECT max(t) FROM (SELECT max(ts) AS t FROM _events
                                     UNION ALL SELECT max(ts) FROM run_finished
                                     UNION ALL SELECT max(t1) FROM busy_intervals))) AS t1
FROM firsts;

CREATE OR REPLACE VIEW busy_islands AS
WITH ordered AS (
    SELECT role, t0, t1,
           max(t1) OVER (PARTITION BY role ORDER BY t0, t1
                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
    FROM busy_intervals
), numbered AS (
    SELECT role, t0, t1,
           sum(CASE WHEN reach IS NULL OR t0 > reach THEN 1 ELSE 0 END)
               OVER (PARTITION BY role ORDER BY t0, t1 ROWS UNBOUNDED PRECEDING) AS island
    FROM ordered
)
SELECT role, island, min(t0) AS t0, max(t1) AS t1 FROM numbered GROUP BY role, island;

CREATE OR REPLACE VIEW time_accounting AS
WITH roles AS (
    SELECT unnest(['engine', 'trainer', 'checkpoint', 'sandbox']) AS role
), grid AS (
    SELECT w.weight_version, w.t0, w.t1, r.role FROM version_windows w CROSS JOIN roles r
), busy AS (
    SELECT g.weight_version, g.role,
           sum(greatest(0, least(i.t1, g.t1) - greatest(i.t0, g.t0))) AS busy_s
    FROM grid g JOIN busy_islands i ON i.role = g.role AND i.t1 > g.t0 AND i.t0 < g.t1
    GROUP BY ALL
), work AS (
    SELECT g.weight_version, g.role,
           sum(greatest(0, least(i.t1, g.t1) - greatest(i.t0, g.t0))) AS work_s,
           count(*) FILTER (WHERE i.t1 >= g.t0 AND i.t1 < g.t1) AS n,
           sum(i.tokens) FILTER (WHERE i.t1 >= g.t0 AND i.t1 < g.t1) AS tokens
    FROM grid g JOIN busy_intervals i ON i.role = g.role AND i.t1 > g.t0 AND i.t0 < g.t1
    GROUP BY ALL
)
SELECT g.weight_version,
       g.role,
       g.t1 - g.t0 AS window_s,
       coalesce(b.busy_s, 0) AS busy_s,
       (g.t1 - g.t0) - coalesce(b.busy_s, 0) AS idle_s,
       coalesce(b.busy_s, 0) / nullif(g.t1 - g.t0, 0) AS busy_frac,
       coalesce(w.work_s, 0) AS work_s,
       coalesce(w.n, 0) AS n,
       coalesce(w.tokens, 0) AS tokens,
       coalesce(w.tokens, 0) / nullif(g.t1 - g.t0, 0) AS tokens_per_s
FROM grid g
LEFT JOIN busy b USING (weight_version, role)
LEFT JOIN work w USING (weight_version, role)
ORDER BY g.weight_version, g.role;

CREATE OR REPLACE VIEW time_accounting_run AS
SELECT role,
       max(t1) - min(t0) AS window_s,
       sum(busy_s) AS busy_s,
       sum(idle_s) AS idle_s,
       sum(busy_s) / nullif(sum(window_s), 0) AS busy_frac,
       sum(work_s) AS work_s,
       sum(n) AS n,
       sum(tokens) AS tokens,
       sum(tokens) / nullif(sum(window_s), 0) AS tokens_per_s
FROM time_accounting JOIN version_windows USING (weight_version)
GROUP BY role
ORDER BY role;

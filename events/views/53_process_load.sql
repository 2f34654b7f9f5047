-- Each process's load (ProcessLoad, published every few seconds by stacx.actors.load): event-loop
-- lag and CPU share, per window, per weight version and per run.
--
-- process_load_windows: one row per window (the table process_load holds the events), with the weight version current at its end (version_windows).
-- process_load_by_version: per (weight_version, process): windows, lag p50 (median of the
--   windows' p50), lag p99 (the worst window's p99), lag_max_ms, cpu_share (mean cores busy),
--   rss_mb (peak), forks (calls that copied the process), saturated (a window's lag p99 over 100 ms: the loop made its work wait).
-- process_load_run: the same per process over the whole run, plus saturated_windows.
CREATE OR REPLACE VIEW process_load_windows AS
SELECT l.run_id, l.process, l.pid, l.ts, l.window_s, l.lag_p50_ms, l.lag_p99_ms, l.lag_max_ms,
       l.cpu_share, l.rss_mb, l.forks,
       (SELECT max(w.weight_version) FROM version_windows w WHERE w.t0 <= l.ts) AS weight_version
FROM process_load l;

CREATE OR REPLACE VIEW process_load_by_version AS
SELECT run_id, weight_version, process, count(*) AS windows,
       round(median(lag_p50_ms), 2) AS lag_p50_ms,
       round(max(lag_p99_ms), 2) AS lag_p99_ms,
       round(max(lag_max_ms), 2) AS lag_max_ms,
       round(sum(cpu_share * window_s) / sum(window_s), 3) AS cpu_share,
       round(max(rss_mb), 1) AS rss_mb,
       sum(forks) AS forks,
       bool_or(lag_p99_ms > 100) AS saturated
FROM process_load_windows GROUP BY run_id, weight_version, process;

CREATE OR REPLACE VIEW process_load_run AS
SELECT run_id, process, count(*) AS windows, sum(window_s) AS span_s,
       round(median(lag_p50_ms), 2) AS lag_p50_ms,
       round(quantile_cont(lag_p99_ms, 0.5), 2) AS lag_p99_ms_median,
       round(max(lag_p99_ms), 2) AS lag_p99_ms,
       round(sum(cpu_share * window_s) / sum(window_s), 3) AS cpu_share,
       round(max(rss_mb), 1) AS rss_mb,
       sum(forks) AS forks,
       count(*) FILTER (WHERE lag_p99_ms > 100) AS saturated_windows
FROM process_load_windows GROUP BY run_id, process;

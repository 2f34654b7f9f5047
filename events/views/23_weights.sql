-- weights: one row per (published version, engine that loaded it). A version that no engine has
-- loaded yet has one row with engine NULL. `select max(version) from weights` is the latest
-- published version; `count(distinct version)` counts publishes.
CREATE OR REPLACE VIEW weights AS
WITH published AS (
    SELECT * FROM weights_published
    QUALIFY row_number() OVER (PARTITION BY version ORDER BY ts DESC, _seq DESC) = 1
), loaded AS (
    SELECT version, engine, min(ts) AS loaded_ts, arg_min(latency_ms, ts) AS load_latency_ms,
           arg_min(bytes, ts) AS load_bytes
    FROM weights_loaded GROUP BY version, engine
)
SELECT p.version,
       p.path,
       p.sha256,
       p.step,
       p.ts AS published_ts,
       l.engine,
       l.loaded_ts,
       l.load_latency_ms,
       l.load_bytes,
       p.bytes AS published_bytes,
       p.run_id
FROM published p
LEFT JOIN loaded l USING (version);

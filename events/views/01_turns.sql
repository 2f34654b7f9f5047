-- turns: one row per model (or scripted) turn (a contract for users' SQL; see events/README.md).
CREATE OR REPLACE VIEW turns AS
SELECT episode_id,
       run_id,
       turn,
       actor,
       len(prompt_ids) AS n_prompt_tokens,
       len(output_ids) AS n_output_tokens,
       weight_version,
       finish_reason,
       engine,
       gen_ms,
       ts
FROM turn_generated;

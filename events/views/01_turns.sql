-- turn_links: one row per stored turn with the chain it belongs to. turn_generated stores a
-- multi-turn episode linearly: a turn whose prompt extends the previous turn's (turn - 1)
-- prompt + output stores only the ids after that prefix, with prefix_len = the prefix's length
-- (0: the whole prompt is stored, as in every log older than the field). A turn stored whole
-- starts a chain (chain_turn = its turn); the turns stored after it with prefix_len > 0 continue
-- it. chain_offset = the ids of the chain before this turn's stored prompt ids (prompt + output
-- of its earlier turns). linked is false for a turn whose prefix_len does not match what
-- precedes it (a missing turn, a corrupt log): reading its chain's ids is then an error (the
-- error names the first such turn), never a wrong prompt.
-- THE one place a whole prompt is rebuilt: `turns` and the trainer's packed read (turn_chains)
-- both take it from here.
CREATE OR REPLACE VIEW turn_links AS
WITH stored AS (
    -- UNION BY NAME: a log older than the prefix_len (segment) field reads it as NULL (-> 0)
    SELECT * REPLACE (coalesce(prefix_len, 0) AS prefix_len, coalesce(segment, 0) AS segment)
    FROM (SELECT * FROM turn_generated
          UNION ALL BY NAME SELECT NULL::BIGINT AS prefix_len, NULL::BIGINT AS segment WHERE false)
), chained AS (
    -- the windows run over the lengths only (not the token lists): joined back below
    SELECT run_id, episode_id, turn, _seq, prefix_len, len(prompt_ids) + len(output_ids) AS _n,
           max(CASE WHEN prefix_len = 0 THEN turn END)
               OVER (PARTITION BY run_id, episode_id ORDER BY turn ROWS UNBOUNDED PRECEDING) AS _chain,
           lag(turn) OVER (PARTITION BY run_id, episode_id ORDER BY turn) AS _previous_turn
    FROM stored
), links AS (
    SELECT run_id, episode_id, turn, _seq,
           _chain AS chain_turn,
           coalesce(sum(_n) OVER (
               PARTITION BY run_id, episode_id, _chain ORDER BY turn
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS chain_offset,
           prefix_len = 0 OR (_previous_turn = turn - 1 AND chain_offset = prefix_len) AS linked
    FROM chained
)
SELECT s.*, l.chain_turn, l.chain_offset, l.linked
FROM stored s
JOIN links l USING (run_id, episode_id, turn, _seq);

-- turn_chains: one row per chain (see turn_links): ids = every stored id of the chain in turn
-- order (turn 1's prompt, its output, turn 2's new prompt ids, its output, ...). A turn's whole
-- prompt is ids[1 : chain_offset + len(its stored prompt ids)]; read linearly, the chains of an
-- episode hold each id once (the trainer's packed read).
CREATE OR REPLACE VIEW turn_chains AS
SELECT run_id,
       episode_id,
       chain_turn,
       CASE WHEN bool_and(linked) THEN flatten(list(list_concat(prompt_ids, output_ids) ORDER BY turn))
            ELSE error('turns: episode ' || episode_id || ' turn ' || min(turn) FILTER (WHERE NOT linked)
                       || ' has prefix_len ' || arg_min(prefix_len, turn) FILTER (WHERE NOT linked)
                       || ' but turn ' || (min(turn) FILTER (WHERE NOT linked) - 1)
                       || ' is missing or differs in length')
       END AS ids
FROM turn_links
GROUP BY run_id, episode_id, chain_turn;

-- turns: one row per model (or scripted) turn (a contract for users' SQL; see events/README.md).
-- prompt_ids is the WHOLE prompt the engine saw (its chain's ids up to n_prompt_tokens).
CREATE OR REPLACE VIEW turns AS
SELECT l.episode_id,
       l.run_id,
       l.turn,
       l.actor,
       l.prefix_len + len(l.prompt_ids) AS n_prompt_tokens,
       len(l.output_ids) AS n_output_tokens,
       l.weight_version,
       l.finish_reason,
       l.engine,
       l.gen_ms,
       l.ts,
       CASE WHEN l.prefix_len = 0 THEN l.prompt_ids
            ELSE list_concat(c.ids[1:l.prefix_len], l.prompt_ids) END AS prompt_ids,
       l.output_ids,
       l.logprobs,
       l.prefix_len,
       l.segment,
       l.chain_turn,
       l.event_id,
       l._seq
FROM turn_links l
LEFT JOIN turn_chains c USING (run_id, episode_id, chain_turn);

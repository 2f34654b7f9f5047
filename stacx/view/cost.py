"""The drift & cost page: the ``gateway_drift`` / ``gateway_episodes`` and ``episode_cost`` views,
summed per run and listed per episode (most expensive first).
"""

from __future__ import annotations

from stacx.view.html import link, table
from stacx.view.pages import Params
from stacx.view.source import Source

COST_SUM_SQL = """select run_id, count(*) as episodes, sum(generated_tokens) as generated_tokens,
       sum(engine_ms) / 1000 as engine_s, sum(queue_ms) / 1000 as queue_s,
       sum(sandbox_ms) / 1000 as sandbox_s, sum(tool_ms) / 1000 as tool_s,
       sum(verifier_ms) / 1000 as verifier_s, sum(trainer_ms) / 1000 as trainer_s
from episode_cost group by run_id order by run_id"""
# seconds and short names, so that the table fits a page (the view's columns are in ms)
COST_SQL = """select episode_id, task_id, status, reward, n_turns as turns, generated_tokens as tokens,
       engine_ms / 1000 as engine_s, queue_ms / 1000 as queue_s, sandbox_start_ms / 1000 as start_s,
       tool_ms / 1000 as tool_s, verifier_ms / 1000 as verifier_s, trainer_ms / 1000 as trainer_s,
       n_train_steps as steps, wall_s
from episode_cost order by engine_ms + sandbox_ms + trainer_ms desc limit 200"""


def cost_page(source: Source, params: Params) -> str:
    ep = {"episode_id": lambda v: link("/episode", str(v)[:12], id=v)}
    parts = []
    if source.has("gateway_drift"):
        drift = source.query("select * from gateway_drift order by run_id, scaffold")
        if drift.rows:
            per_episode = source.query(
                "select episode_id, scaffold, task_id, n_calls, n_not_extending, "
                "n_segments, reward from gateway_episodes "
                "order by n_not_extending desc, n_segments desc limit 200"
            )
            parts += [
                "<h2>gateway drift per scaffold</h2>",
                table(drift.columns, drift.rows),
                "<h3>per episode</h3>",
                table(per_episode.columns, per_episode.rows, cells=ep),
            ]
        else:
            parts.append(
                "<h2>gateway drift</h2><p>No gateway calls in these runs (no installed scaffold).</p>"
            )
    if source.has("episode_cost"):
        total = source.query(COST_SUM_SQL)
        rows = source.query(COST_SQL)
        parts += [
            "<h2>cost per run</h2>",
            table(total.columns, total.rows),
            "<h2>cost per episode</h2><p>Seconds; start_s is the sandbox's start, steps the "
            "train steps it fed, trainer_s an estimate (a step's time shared by generated "
            "tokens); see events/views/41_episode_cost.sql.</p>",
            table(rows.columns, rows.rows, cells=ep),
        ]
    return "".join(parts) or "<p>The drift and cost views are not loaded for this log.</p>"

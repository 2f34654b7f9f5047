"""The eval report, as SQL over a run's `episodes`, `turns` and `infra_failed`; each function
returns (sql, columns, rows) so the CLI prints the SQL behind each table. Unscored samples are never
counted as 0; pass@k is the unbiased estimator of Chen et al. (2021).
Design: docs/concepts/actors.md#the-rollout-worker
"""

from __future__ import annotations

from stacx.actors.base import Query

Table = tuple[str, list[str], list[tuple[object, ...]]]

_SAMPLES = """WITH samples AS (
    SELECT task_id, group_id, sample_index, max(reward) AS reward
    FROM episodes WHERE status = 'scored'
    GROUP BY task_id, group_id, sample_index
), per_task AS (
    SELECT task_id, count(*) AS n, count(*) FILTER (WHERE reward >= 1) AS c, avg(reward) AS r
    FROM samples GROUP BY task_id
)"""


def summary_sql(k: int) -> str:
    """Tasks, scored samples, pass@1, pass@k (k > 1 only), mean reward."""
    pass_k = (
        f"""
       round(avg(CASE WHEN n < {k} THEN NULL
                      WHEN n - c < {k} THEN 1.0
                      WHEN c = 0 THEN 0.0
                      ELSE 1.0 - list_aggregate(
                          list_transform(range(n - c + 1, n + 1), lambda i: 1.0 - {k} / i), 'product')
                 END), 4) AS "pass@{k}","""
        if k > 1
        else ""
    )
    return f"""{_SAMPLES}
SELECT count(*) AS tasks,
       sum(n) AS scored_samples,
       round(avg(c / n), 4) AS "pass@1",{pass_k}
       round(avg(r), 4) AS mean_reward
FROM per_task"""


EFFORT_SQL = """SELECT count(DISTINCT e.episode_id) AS episodes,
       round(count(t.turn) / count(DISTINCT e.episode_id), 2) AS turns_per_episode,
       round(avg(t.n_output_tokens), 1) AS output_tokens_per_turn,
       sum(t.n_output_tokens) AS output_tokens,
       max(t.n_prompt_tokens + t.n_output_tokens) AS longest_context,
       round(sum(t.gen_ms) / 1000, 1) AS gen_seconds
FROM episodes e LEFT JOIN turns t USING (episode_id)
WHERE e.status = 'scored'"""

STOPS_SQL = """SELECT stop_reason, count(*) AS episodes, round(avg(reward), 4) AS mean_reward
FROM episodes WHERE status = 'scored'
GROUP BY stop_reason ORDER BY episodes DESC"""

FAILURES_SQL = """SELECT failure_kind, will_retry, count(*) AS failures, any_value(message) AS example
FROM infra_failed
GROUP BY failure_kind, will_retry ORDER BY failures DESC"""

SCAFFOLD_SQL = """SELECT scaffold, exit_code, count(*) AS failures, any_value(stderr_last_line) AS stderr
FROM scaffold_failures
GROUP BY scaffold, exit_code ORDER BY failures DESC"""
SCAFFOLD_TITLE = "Scaffold failures (exited before any model call was answered; never scored)"

UNSCORED_SQL = "SELECT count(*) AS unscored_samples FROM samples WHERE NOT scored"

PROGRESS_SQL = "SELECT count(*) AS done FROM samples WHERE done"


async def run_table(query: Query, sql: str) -> Table:
    table = await query(sql)
    rows = list(zip(*(col.to_pylist() for col in table.columns), strict=True))
    return sql, list(table.column_names), rows


async def report(query: Query, k: int) -> list[tuple[str, Table]]:
    """Every table of the eval report, titled, in print order."""
    scaffold = await run_table(query, SCAFFOLD_SQL)
    return [
        ("Scores", await run_table(query, summary_sql(k))),
        ("Effort", await run_table(query, EFFORT_SQL)),
        ("Stop reasons", await run_table(query, STOPS_SQL)),
        ("Infrastructure failures", await run_table(query, FAILURES_SQL)),
        *([(SCAFFOLD_TITLE, scaffold)] if scaffold[2] else []),
        ("Unscored samples", await run_table(query, UNSCORED_SQL)),
    ]

"""The eval report's SQL on a real DuckDB: pass@k against the closed-form estimator."""

from __future__ import annotations

import math

import duckdb
import pyarrow as pa

from stacx.rollout import report


def pass_at_k(n: int, c: int, k: int) -> float:
    return 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)


def con_with(samples: list[tuple[str, int, float | None, str]]) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE episodes (episode_id VARCHAR, task_id VARCHAR, group_id VARCHAR, "
        "sample_index BIGINT, status VARCHAR, reward DOUBLE, stop_reason VARCHAR)"
    )
    for i, (task, index, reward, status) in enumerate(samples):
        con.execute(
            "INSERT INTO episodes VALUES (?, ?, ?, ?, ?, ?, 'submitted')",
            [f"e{i}", task, f"g-{task}", index, status, reward],
        )
    return con


async def test_pass_at_k_matches_the_unbiased_estimator() -> None:
    rewards = {"a": [1, 0, 0, 1, 0], "b": [0, 0, 0, 0, 0], "c": [1, 1, 1, 1, 0]}
    rows: list[tuple[str, int, float | None, str]] = [
        (t, i, float(r), "scored") for t, rs in rewards.items() for i, r in enumerate(rs)
    ]
    rows.append(("a", 5, None, "failed"))  # an infra failure: not a 0, left out
    con = con_with(rows)

    async def query(sql: str) -> pa.Table:
        return con.sql(sql).to_arrow_table()

    for k in (1, 2, 3):
        _, columns, [row] = await report.run_table(query, report.summary_sql(k))
        got = dict(zip(columns, row, strict=True))
        want = sum(pass_at_k(5, sum(rs), k) for rs in rewards.values()) / 3
        assert got[f"pass@{k}"] == round(want, 4)
        assert got["scored_samples"] == 15
    assert got["pass@1"] == round((2 / 5 + 0 + 4 / 5) / 3, 4)
    assert got["mean_reward"] == round((2 / 5 + 0 + 4 / 5) / 3, 4)


async def test_tasks_with_fewer_than_k_samples_are_left_out_of_pass_at_k() -> None:
    con = con_with([("a", 0, 1.0, "scored"), ("b", 0, 0.0, "scored"), ("b", 1, 1.0, "scored")])

    async def query(sql: str) -> pa.Table:
        return con.sql(sql).to_arrow_table()

    _, columns, [row] = await report.run_table(query, report.summary_sql(2))
    got = dict(zip(columns, row, strict=True))
    assert got["pass@2"] == 1.0  # only b counts: one of its two samples passed
    assert got["pass@1"] == round((1.0 + 0.5) / 2, 4)

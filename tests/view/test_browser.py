"""`stacx view` over a real run's log, driven in headless Chromium: every page loads, the
episode page shows a turn's text decoded from its recorded ids, the episodes filters change
the list, the SQL box answers (and refuses to write)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from stacx.store import db

pytestmark = pytest.mark.model

PAGES = {
    "/": "runs",
    "/episodes": "episodes",
    "/lineage": "lineage",
    "/cost": "drift & cost",
    "/load": "time & load",
    "/sql": "SQL",
    "/compare": "compare",
}


def recorded(run_dir: Path, sql: str) -> list[tuple[object, ...]]:
    with duckdb.connect(str(db.db_path(run_dir)), read_only=True) as con:  # plain DuckDB, no STACX
        return con.execute(sql).fetchall()


def test_every_page_loads(viewer: str, page) -> None:
    for path, title in PAGES.items():
        response = page.goto(viewer + path)
        assert response.status == 200, path
        assert page.locator("h1").inner_text() == title
        assert page.locator("header nav a").count() == len(PAGES)


def test_load_page_shows_the_time_accounting_and_each_process(
    viewer: str, run_dir: Path, page
) -> None:
    processes = {p for (p,) in recorded(run_dir, "select distinct process from process_load")}
    assert "launcher" in processes  # local placement: one process, the launcher's
    page.goto(viewer + "/load")
    assert "where the time went" in page.locator("h2").all_inner_texts()
    tables = page.locator("table")
    assert "engine" in tables.nth(0).inner_text()  # time_accounting_run's roles
    assert all(p in tables.nth(1).inner_text() for p in processes)


def test_runs_page_shows_the_run_and_its_reward_curve(viewer: str, run_dir: Path, page) -> None:
    [(run_id, n)] = recorded(run_dir, "select run_id, count(*) from episode_started group by 1")
    page.goto(viewer + "/")
    assert run_id in page.locator("section h2").first.inner_text()
    assert page.locator("svg.chart").count() >= 1
    assert f"{n} / {n}" in page.locator("section table").first.inner_text()  # samples done


def test_episode_page_shows_the_decoded_text_of_a_turn(viewer: str, run_dir: Path, page) -> None:
    from transformers import AutoTokenizer

    from stacx.hf import resolve_model

    [(episode, output_ids, logprobs)] = recorded(
        run_dir,
        "select episode_id, output_ids, logprobs from turn_generated order by episode_id limit 1",
    )
    text = AutoTokenizer.from_pretrained(resolve_model("default")).decode(
        output_ids, skip_special_tokens=False
    )
    page.goto(f"{viewer}/episode?id={episode}")
    output = page.locator("#turn-0 pre.output")
    assert output.inner_text() == text
    tokens = output.locator("span.tok")
    assert tokens.count() == len(output_ids)  # ASCII-ish text: one span per token
    title = tokens.first.get_attribute("title")
    assert f"logprob {logprobs[0]:.4g}" in title and "weight v0" in title
    assert (
        "Problem:" in page.locator("#turn-0 pre.prompt").text_content()
    )  # the prompt, decoded (folded)


def test_filters_change_the_episode_list(viewer: str, run_dir: Path, page) -> None:
    tasks = sorted(t for (t,) in recorded(run_dir, "select task_id from episode_started"))
    page.goto(viewer + "/episodes")
    rows = page.locator("table.episodes tbody tr")
    assert rows.count() == len(tasks) == 2
    split = page.locator("table.episodes th").all_inner_texts().index("split")
    # a `stacx eval` run's episodes are eval episodes (split), though no periodic eval (role)
    assert [r.locator("td").nth(split).inner_text() for r in rows.all()] == ["eval", "eval"]
    with page.expect_navigation():
        page.select_option("select[name=task]", tasks[1])  # the page's script submits the form
    assert "task=" in page.url
    assert rows.count() == 1
    assert tasks[1] in rows.first.inner_text() and tasks[0] not in rows.first.inner_text()
    page.goto(viewer + "/episodes?status=failed")
    assert page.locator("table.episodes td.empty").count() == 1  # nothing failed in this run
    bad = page.request.get(viewer + "/episodes?sort=reward;drop")
    assert bad.status == 400 and "accepted: started_ts" in bad.text()


def test_sql_box_answers_and_stays_read_only(viewer: str, run_dir: Path, page) -> None:
    [(n,)] = recorded(run_dir, "select count(*) from episode_started")
    page.goto(viewer + "/sql")
    assert page.locator("ul.views").inner_text().count("reward_by_weight_version") == 1
    page.fill("textarea[name=q]", "select count(*) as n from episodes")
    with page.expect_navigation():
        page.click("button[type=submit]")
    assert page.locator("table.result td").inner_text() == str(n)
    for query, error in (
        ("select * from no_such_view", "no_such_view"),
        ("create table x (a int)", "read-only mode"),
        ("select * from read_csv('/etc/hostname')", "disabled by configuration"),
    ):
        page.fill("textarea[name=q]", query)
        with page.expect_navigation():
            page.click("button[type=submit]")
        assert error in page.locator("pre.error").inner_text()


def _typed(page, query: str) -> None:  # type: ignore[no-untyped-def]
    page.fill("textarea[name=q]", query)
    with page.expect_navigation():
        page.click("button[type=submit]")


def test_a_typed_statement_cannot_change_the_views_the_pages_read(
    viewer: str, run_dir: Path, page
) -> None:
    [(n,)] = recorded(run_dir, "select count(*) from episode_started")
    page.goto(viewer + "/sql")
    # EXPLAIN ANALYZE runs the statement it explains: each typed query has a connection of its own
    for query in (
        "explain analyze create or replace temp view episodes as select 1 as x",
        "explain analyze drop view episodes",
        "detach r0",
    ):
        _typed(page, query)
        _typed(page, "select count(*) as n from episodes")
        assert page.locator("table.result td").inner_text() == str(n), query
        assert page.request.get(viewer + "/").status == 200, query
        assert page.request.get(viewer + "/episodes").status == 200, query


def test_a_long_query_is_interrupted_and_the_page_says_so(viewer: str, page) -> None:
    from tests.view.conftest import SQL_TIMEOUT_S

    page.goto(viewer + "/sql")
    _typed(page, "select sum(i*i) from range(12000000000) t(i)")
    error = page.locator("pre.error").inner_text()
    assert f"interrupted after {SQL_TIMEOUT_S} s" in error and "--sql-timeout" in error
    _typed(page, "select 42 as answer")  # the viewer answers again
    assert page.locator("table.result td").inner_text() == "42"


def test_a_foreign_host_header_is_refused(viewer: str, page) -> None:
    response = page.request.get(viewer + "/", headers={"Host": "attacker.example:80"})
    assert response.status == 421


def test_the_views_are_listed_once_each_with_their_columns_once(viewer: str, page) -> None:
    page.goto(viewer + "/sql")
    items = page.locator("ul.views li").all_inner_texts()
    names = [i.split()[0] for i in items]
    assert len(names) == len(set(names)) and "episodes" in names
    columns = next(i for i in items if i.split()[0] == "tasks_lost").split(maxsplit=1)[1]
    assert (
        columns == "task_id"
    )  # not "task_id, task_id" (the file's copy of the view and the temp one)


def test_the_cost_page_fits_the_page(viewer: str, page) -> None:
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(viewer + "/cost")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


def test_a_chart_shows_negative_ticks_whole_and_its_titles_clear_of_them(viewer: str, page) -> None:
    from stacx.view.html import line_chart

    svg = line_chart(
        [("loss", [(0.0, 0.5), (1.0, -0.03354), (2.0, 0.2)])],
        title="train loss",
        x_label="step",
        y_label="loss",
    )
    page.goto(viewer + "/")  # the viewer's origin, then the stylesheet its pages use
    page.set_content(
        f'<link rel="icon" href="data:,"><link rel="stylesheet" href="/static/view.css">{svg}'
    )
    page.wait_for_load_state()
    boxes = page.evaluate("""() => [...document.querySelectorAll('svg.chart text')].map(t => {
        const b = t.getBoundingClientRect(), s = t.ownerSVGElement.getBoundingClientRect();
        return {text: t.textContent, cls: t.getAttribute('class'), left: b.left - s.left,
                right: b.right - s.left, top: b.top - s.top, bottom: b.bottom - s.top}; })""")
    ticks = [b for b in boxes if b["cls"] == "tick"]
    assert "-0.03354" in [t["text"] for t in ticks]
    assert all(t["left"] >= 0 for t in ticks)  # no tick, its minus sign included, is clipped
    for title in (b for b in boxes if b["cls"] == "label"):
        for t in ticks:  # the axis titles overlap no tick
            apart = (
                title["right"] <= t["left"]
                or t["right"] <= title["left"]
                or title["bottom"] <= t["top"]
                or t["bottom"] <= title["top"]
            )
            assert apart, (title["text"], t["text"])

"""The viewer's pages: runs, episodes, lineage, drift & cost, SQL, compare. Each is
``(source, params) -> HTML`` over ``Source.query`` with bound parameters (a sort column only from
``SORTS``); a bad parameter raises ``BadRequest`` naming it and the accepted values.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from stacx.errors import StacxError
from stacx.harbor.jobs import pass_at_k
from stacx.view.html import Series, esc, line_chart, link, select, table
from stacx.view.source import Result, Source

Params = Mapping[str, str]
N = TypeVar("N", int, float)


class BadRequest(StacxError):
    """A query-string parameter the page cannot use (named, with what it accepts)."""


def run_ids(source: Source) -> list[str]:
    """The viewed runs' ids, in the order given (a run that has not started yet: none)."""
    r = source.query("select run_id, min(_seq) from run_started group by run_id")
    seen = {str(x[0]) for x in r.rows}
    ordered = [str(f.get("run_id")) for f in source.run_files() if str(f.get("run_id")) in seen]
    return ordered + sorted(seen - set(ordered))


def _number(params: Params, name: str, kind: Callable[[str], N]) -> N | None:
    v = params.get(name, "")
    if v == "":
        return None
    try:
        return kind(v)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise BadRequest(f"parameter {name}={v!r}: expected {what}") from None


def _section(title: str, body: str) -> str:
    return f"<section><h2>{esc(title)}</h2>{body}</section>"


def _series(
    r: Result, x: str, y: str, by: str | None = None
) -> list[tuple[str, list[tuple[float, float]]]]:
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for d in r.dicts():
        if d[x] is not None and d[y] is not None:
            out[str(d[by]) if by else y].append((float(d[x]), float(d[y])))  # type: ignore[arg-type]
    return sorted(out.items())


# ---- runs ---------------------------------------------------------------------------------------


def runs_page(source: Source, params: Params) -> str:
    files = {str(f.get("run_id")): f for f in source.run_files()}
    parts = [_run_section(source, run_id, files.get(run_id, {})) for run_id in run_ids(source)]
    return "".join(parts) or "<p>No run has started in these directories yet.</p>"


def _run_head(source: Source, run_id: str, run_file: Mapping[str, object]) -> tuple[str, object]:
    """A run's summary table and its resolved config's JSON."""
    ((recipe, config_json, started, attempts),) = source.query(
        "select any_value(recipe), arg_min(config_json, _seq), min(ts), max(attempt) + 1 "
        "from run_started where run_id = ?",
        [run_id],
    ).rows
    finished = source.query(
        "select status, message from run_finished where run_id = ? order by _seq desc limit 1",
        [run_id],
    ).rows
    status = str(finished[0][0]) if finished else str(run_file.get("status") or "running")
    ((planned, done),) = source.query(
        "select (select coalesce(sum(n_samples), 0) from task_scheduled where run_id = ?), "
        "(select count(*) from samples where run_id = ? and done)",
        [run_id, run_id],
    ).rows
    head = table(
        ["run_id", "recipe", "status", "started", "attempts", "samples done"],
        [[run_id, recipe, status, _ts(started), f"{attempts}", f"{done} / {planned}"]],
    )
    return head, config_json


def _run_section(source: Source, run_id: str, run_file: Mapping[str, object]) -> str:
    head, config_json = _run_head(source, run_id, run_file)
    counts = source.query(
        "select status, count(*) from episodes where run_id = ? group by 1 order by 1", [run_id]
    ).rows
    episodes = " ".join(link("/episodes", f"{s}: {n}", run=run_id, status=s) for s, n in counts)
    rbv = reward_curve(source, run_id)
    charts = [_reward_chart(_series(rbv, "weight_version", "reward_mean", "split"))]
    steps = source.query(
        "select step, loss, reward_mean, n_samples, tokens, duration_ms, weight_version "
        "from train_steps where run_id = ? order by step",
        [run_id],
    )
    if steps.rows:
        charts.append(
            line_chart(
                _series(steps, "step", "loss"), title="train loss", x_label="step", y_label="loss"
            )
        )
    curve = source.query("select * from eval_curve") if _single(source) else Result([], [])
    if curve.rows:
        charts.append(
            _reward_chart(_series(curve, "weight_version", "reward_mean"), "periodic eval")
        )
    config = json.dumps(json.loads(str(config_json)), indent=2) if config_json else "{}"
    body = [
        head,
        f"<p>episodes by status: {episodes or 'none yet'}</p>",
        f'<div class="charts">{"".join(charts)}</div>',
        "<h3>reward by weight version</h3>",
        table(rbv.columns, rbv.rows),
    ]
    if curve.rows:
        body += ["<h3>eval curve</h3>", table(curve.columns, curve.rows)]
    if steps.rows:
        body += ["<h3>train steps</h3>", table(steps.columns, steps.rows[-50:])]
    body.append(f"<details><summary>resolved recipe</summary><pre>{esc(config)}</pre></details>")
    return _section(f"run {run_id}", "".join(body))


def _reward_chart(
    series: Sequence[Series], title: str = "reward by weight version", width: int = 460
) -> str:
    return line_chart(
        series, title=title, x_label="weight version", y_label="mean reward", width=width
    )


def _single(source: Source) -> bool:
    return len(source.run_dirs) == 1


def reward_curve(source: Source, run_id: str) -> Result:
    """Reward by weight version: ``reward_by_weight_version`` for one run; for several (the view
    covers their union) the same statistics over each run's own scored episodes."""
    if _single(source):
        return source.query(
            "select * exclude (first_ts, last_ts) from reward_by_weight_version "
            "order by split, weight_version"
        )
    return source.query(
        "select first_weight_version as weight_version, split, count(*) as n_episodes, "
        "avg(reward) as reward_mean, stddev_samp(reward) as reward_std, "
        "avg(case when reward >= 1 then 1.0 else 0.0 end) as pass_rate "
        "from episodes where run_id = ? and status = 'scored' group by all order by 2, 1",
        [run_id],
    )


def _ts(ts: object) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(float(ts), UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if ts else "–"  # type: ignore[arg-type]


# ---- episodes -----------------------------------------------------------------------------------

# filter parameter -> (SQL predicate with one bound parameter, parser)
FILTERS = {
    "run": "run_id = ?",
    "task": "task_id = ?",
    "status": "status = ?",
    "split": "split = ?",
    "role": "role = ?",
    "failure_kind": "failure_kind = ?",
    "weight_version": "weight_version = ?",
    "min_reward": "reward >= ?",
    "max_reward": "reward <= ?",
}
SORTS = (
    "started_ts",
    "reward",
    "task_id",
    "status",
    "weight_version",
    "n_turns",
    "n_tool_calls",
    "failure_kind",
)
EPISODE_COLUMNS = (  # the episodes page's table
    "episode_id, run_id, task_id, sample_index, status, reward, failure_kind, stop_reason, "
    "weight_version, n_turns, n_tool_calls, split, role"
)
PAGE_SIZE = 200
# the episodes form's <select> filters: parameter -> the column whose values it offers
FORM_FILTERS = {
    "task": "task_id",
    **{c: c for c in ("status", "split", "role", "weight_version", "failure_kind")},
}


def episode_filter(params: Params) -> tuple[str, list[object]]:
    """The WHERE clause (bound parameters) of the episodes page's filters."""
    clauses: list[str] = []
    values: list[object] = []
    for name, predicate in FILTERS.items():
        value: object
        if name == "weight_version":
            value = _number(params, name, int)
        elif name.endswith("_reward"):
            value = _number(params, name, float)
        else:
            value = params.get(name) or None
        if value is not None:
            clauses.append(predicate)
            values.append(value)
    return (" where " + " and ".join(clauses) if clauses else ""), values


def episodes_page(source: Source, params: Params) -> str:
    sort = params.get("sort") or "started_ts"
    if sort not in SORTS:
        raise BadRequest(f"parameter sort={sort!r}: accepted: {', '.join(SORTS)}")
    order = params.get("order") or ("asc" if sort in ("task_id", "status") else "desc")
    if order not in ("asc", "desc"):
        raise BadRequest(f"parameter order={order!r}: accepted: asc, desc")
    offset = _number(params, "offset", int) or 0
    where, values = episode_filter(params)
    total = int(source.query(f"select count(*) from episodes{where}", values).rows[0][0])  # type: ignore[call-overload]
    r = source.query(
        f"select {EPISODE_COLUMNS} from episodes{where} "
        f"order by {sort} {order} nulls last, episode_id limit {PAGE_SIZE} offset ?",
        [*values, offset],
    )
    form = _episode_form(source, params, sort, order)
    cells = {
        "episode_id": lambda v: link("/episode", str(v)[:12], id=v),
        "task_id": lambda v: link("/episodes", v, **{**params, "task": v, "offset": ""}),
    }
    shown = f'<p class="count">{total} episodes'
    if total > PAGE_SIZE:
        shown += f", {offset + 1}–{min(offset + PAGE_SIZE, total)} shown"
    nav = ""
    if offset + PAGE_SIZE < total:
        nav = " " + link("/episodes", "next page", **{**params, "offset": offset + PAGE_SIZE})
    body = [form, shown + nav + "</p>", table(list(r.columns), r.rows, cells=cells, cls="episodes")]
    body.append(_section("pass@k per task", _pass_at_k_table(source, where, values)))
    return "".join(body)


def _distinct(source: Source, column: str) -> list[object]:
    sql = f"select distinct {column} from episodes where {column} is not null order by 1"
    return [r[0] for r in source.query(sql).rows]


def _episode_form(source: Source, params: Params, sort: str, order: str) -> str:
    fields = [
        select("run", run_ids(source), params.get("run", "")) if not _single(source) else "",
        *(
            select(name, _distinct(source, column), params.get(name, ""))
            for name, column in FORM_FILTERS.items()
        ),
        f'<label>reward ≥ <input name="min_reward" size="4" value="{esc(params.get("min_reward", ""))}"></label>',
        f'<label>reward ≤ <input name="max_reward" size="4" value="{esc(params.get("max_reward", ""))}"></label>',
        select("sort", SORTS, sort, blank=""),
        select("order", ("desc", "asc"), order, blank=""),
        '<button type="submit">filter</button> <a href="/episodes">clear</a>',
    ]
    return f'<form class="filters" method="get" action="/episodes">{"".join(fields)}</form>'


def _pass_at_k_table(source: Source, where: str, values: list[object]) -> str:
    """pass@k per task over the filtered episodes' scored samples (``jobs.pass_at_k``)."""
    r = source.query(
        f"select task_id, group_id, sample_index, max(reward) filter (where status = 'scored') as reward "
        f"from episodes{where} group by all",
        values,
    )
    passed: dict[str, list[bool]] = defaultdict(list)
    unscored: dict[str, int] = defaultdict(int)
    for task, _group, _index, reward in r.rows:
        if isinstance(reward, int | float):
            passed[str(task)].append(reward >= 1.0)
        else:
            unscored[str(task)] += 1
    ks = [1, 2, 4, 8, 16]
    rows = []
    for task in sorted(set(passed) | set(unscored)):
        p = passed[task]
        est = pass_at_k({task: p}) if p else {}
        rows.append([task, len(p), sum(p), unscored[task], *(est.get(str(k)) for k in ks)])
    return table(
        ["task_id", "scored samples", "passed", "unscored", *(f"pass@{k}" for k in ks)], rows
    )


# ---- lineage ------------------------------------------------------------------------------------


def lineage_page(source: Source, params: Params) -> str:
    """Weight versions and the episodes each trained on; ``version=`` or ``episode=`` narrows it."""
    version, episode = _number(params, "version", int), params.get("episode") or None
    ep = lambda v: link("/episode", str(v)[:12], id=v)  # noqa: E731
    ver = lambda v: link("/lineage", v, version=v)  # noqa: E731
    if episode:
        r = source.query(
            "select weight_version, step, algorithm, run_id from lineage where episode_id = ? "
            "order by weight_version",
            [episode],
        )
        head = (
            f"<p>Episode {link('/episode', episode, id=episode)} was trained on by these steps:</p>"
        )
        return head + table(r.columns, r.rows, cells={"weight_version": ver})
    if version is not None:
        r = source.query(
            "select episode_id, task_id, reward, episode_weight_version, step, algorithm, "
            "imported, source_run_id, origin_run_id from lineage where weight_version = ? "
            "order by task_id, episode_id",
            [version],
        )
        return (
            f"<p>Weight version {version} was trained on {len(r.rows)} episodes "
            f"({link('/lineage', 'all versions')}):</p>"
            + table(r.columns, r.rows, cells={"episode_id": ep, "episode_weight_version": ver})
        )
    r = source.query(
        "select run_id, weight_version, count(distinct step) as steps, any_value(algorithm) as algorithm, "
        "count(distinct episode_id) as episodes, count(distinct task_id) as tasks, avg(reward) as reward_mean, "
        "min(episode_weight_version) as oldest_episode_version, bool_or(imported) as any_imported "
        "from lineage group by all order by run_id, weight_version"
    )
    note = "<p>No train step recorded: nothing trained on these runs' episodes.</p>"
    return ("" if r.rows else note) + table(r.columns, r.rows, cells={"weight_version": ver})


# ---- SQL ----------------------------------------------------------------------------------------


def sql_page(source: Source, params: Params) -> str:
    """A SQL box (one SELECT over the attached runs; errors shown), and the views' columns."""
    q = params.get("q", "").strip()
    out = ""
    if q:
        try:
            r, more = source.query_user(q)
            out = table(r.columns, r.rows, cls="result") + (
                "<p>(first 1000 rows shown)</p>"
                if more
                else f'<p class="count">{len(r.rows)} rows</p>'
            )
        except StacxError as exc:
            out = f'<pre class="error">{esc(exc)}</pre>'
    form = (
        '<form method="get" action="/sql"><textarea name="q" rows="6" cols="100" '
        f'placeholder="select * from episodes limit 10">{esc(q)}</textarea><br>'
        '<button type="submit">run</button></form>'
    )
    # the project views and the event tables, as `stacx sql` sees them (several runs: the
    # tables too are temp views over the attached runs' union); a view the log file also holds
    # (the recorder's copy) is listed once, as the temp view that answers
    views = source.query(
        "with c as (select * from duckdb_columns() where not internal "
        "and database_name in ('temp', current_database())) "
        "select table_name, string_agg(column_name, ', ' order by column_index) from c "
        "where database_name = 'temp' or table_name not in (select table_name from c where database_name = 'temp') "
        "group by 1 order by 1"
    )
    listing = "".join(
        f'<li><a href="#" class="view-name" data-q="select * from {esc(n)} limit 20">'
        f"{esc(n)}</a> <small>{esc(cols)}</small></li>"
        for n, cols in views.rows
    )
    return (
        form
        + out
        + _section("views and tables (a name fills the box)", f'<ul class="views">{listing}</ul>')
    )


# ---- compare ------------------------------------------------------------------------------------


def compare_page(source: Source, params: Params) -> str:
    """Two runs side by side: both reward curves, and per task their episodes."""
    ids = run_ids(source)
    if len(ids) < 2:
        return "<p>Compare needs two runs: <code>stacx view RUN_A RUN_B</code>.</p>"
    a, b = params.get("a") or ids[0], params.get("b") or ids[1]
    for name, v in (("a", a), ("b", b)):
        if v not in ids:
            raise BadRequest(f"parameter {name}={v!r}: accepted: {', '.join(ids)}")
    series = []
    for label, rid in (("A", a), ("B", b)):
        for split, pts in _series(
            reward_curve(source, rid), "weight_version", "reward_mean", "split"
        ):
            series.append((f"{label} {split}", pts))
    chart = _reward_chart(series, width=620)
    form = (
        '<form class="filters" method="get" action="/compare">'
        + select("a", ids, a, blank="")
        + select("b", ids, b, blank="")
        + '<button type="submit">compare</button></form>'
    )
    task = params.get("task") or None
    per_task = source.query(
        "select task_id, count(*) filter (where run_id = ?) as episodes_a, "
        "avg(reward) filter (where run_id = ? and status = 'scored') as reward_a, "
        "count(*) filter (where run_id = ?) as episodes_b, "
        "avg(reward) filter (where run_id = ? and status = 'scored') as reward_b "
        "from episodes where run_id in (?, ?) group by 1 order by 1",
        [a, a, b, b, a, b],
    )
    cells = {"task_id": lambda v: link("/compare", v, a=a, b=b, task=v)}
    body = [
        form,
        f"<p>A = {esc(a)}, B = {esc(b)}</p>",
        chart,
        _section("tasks", table(per_task.columns, per_task.rows, cells=cells)),
    ]
    if task:
        body.append(_section(f"task {task}", _task_sides(source, a, b, task)))
    return "".join(body)


def _task_sides(source: Source, a: str, b: str, task: str) -> str:
    """The episodes of `task` in runs `a` and `b`, side by side."""
    cols = ["episode_id", "status", "reward", "weight_version", "n_turns", "stop_reason"]
    sides = []
    for label, rid in (("A", a), ("B", b)):
        r = source.query(
            f"select {', '.join(cols)} from episodes where run_id = ? and task_id = ? "
            "order by started_ts",
            [rid, task],
        )
        sides.append(
            f"<div><h3>{label}: {esc(rid)}</h3>"
            + table(
                cols, r.rows, cells={"episode_id": lambda v: link("/episode", str(v)[:12], id=v)}
            )
            + "</div>"
        )
    return f'<div class="side-by-side">{"".join(sides)}</div>'

"""HTML building blocks of the viewer: escaped text, tables, inline SVG charts, the page frame.
Every value reaching a page goes through ``esc`` (or is a number formatted here): log content is
untrusted and never markup.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlencode

Cell = Callable[[object], str]
PALETTE = ("#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2")


def esc(value: object) -> str:
    """Text for an HTML body or attribute (quotes escaped too)."""
    return html.escape("" if value is None else str(value), quote=True)


def fmt(value: object) -> str:
    """A cell's text: floats to 4 significant digits, NULL as an en dash, the rest as is."""
    if value is None:
        return "–"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def href(path: str, **params: object) -> str:
    """A link to a viewer page; parameters that are None or "" are left out."""
    kept = {k: str(v) for k, v in params.items() if v is not None and v != ""}
    return esc(path + ("?" + urlencode(kept) if kept else ""))


def link(path: str, text: object, **params: object) -> str:
    return f'<a href="{href(path, **params)}">{esc(text)}</a>'


def table(
    columns: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    cells: Mapping[str, Cell] | None = None,
    cls: str = "",
    max_chars: int = 200,
) -> str:
    """A table; ``cells``: column -> its cell's HTML maker (else escaped, cut at ``max_chars``)."""
    cells = cells or {}
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = []
    for r in rows:
        tds = []
        for c, v in zip(columns, r, strict=True):
            if c in cells:
                tds.append(f"<td>{cells[c](v)}</td>")
                continue
            text = fmt(v)
            if len(text) > max_chars:
                tds.append(f'<td title="{esc(text)}">{esc(text[:max_chars])}…</td>')
            else:
                tds.append(f"<td>{esc(text)}</td>")
        body.append("<tr>" + "".join(tds) + "</tr>")
    if not rows:
        body.append(f'<tr><td colspan="{len(columns)}" class="empty">no rows</td></tr>')
    return f'<table class="{esc(cls)}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


Series = tuple[str, Sequence[tuple[float, float]]]  # (label, [(x, y)])


@dataclass(frozen=True)
class _Plot:
    """A chart's plot area in pixels (left, top, width, height) and the data range it spans."""

    left: int
    top: int
    w: int
    h: int
    x0: float
    x1: float
    y0: float
    y1: float

    def sx(self, x: float) -> float:
        return self.left + (x - self.x0) / (self.x1 - self.x0) * self.w

    def sy(self, y: float) -> float:
        return self.top + self.h - (y - self.y0) / (self.y1 - self.y0) * self.h


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    x_label: str,
    y_label: str,
    width: int = 460,
    height: int = 220,
) -> str:
    """An inline SVG line chart (points marked, each with a title giving its values)."""
    points = [p for _, pts in series for p in pts if not any(math.isnan(v) for v in p)]
    if not points:
        return f'<div class="chart empty"><b>{esc(title)}</b><br>no data yet</div>'
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = min(0.0, min(p[1] for p in points)), max(p[1] for p in points)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y1 = y0 + 1
    y_ticks = [(y, fmt(float(y))) for y in (y0, (y0 + y1) / 2, y1)]
    # room for the y title (a 11px line, rotated) and the longest tick (~6.5px a character at
    # 11px), so neither a tick's minus sign is clipped nor the title overlaps the ticks
    left = 22 + round(6.5 * max(len(t) for _, t in y_ticks))
    right, top, bottom = 12, 24, 40
    plot = _Plot(left, top, width - left - right, height - top - bottom, x0, x1, y0, y1)
    parts = _axes(plot, y_ticks, title, x_label, y_label, width, height)
    for i, (label, pts) in enumerate(series):
        parts += _line(plot, i, label, pts, legend=len(series) > 1)
    parts.append("</svg>")
    return "".join(parts)


def _axes(
    plot: _Plot,
    y_ticks: list[tuple[float, str]],
    title: str,
    x_label: str,
    y_label: str,
    width: int,
    height: int,
) -> list[str]:
    """A chart's opening: the svg element, its title, the axes with their ticks and labels."""
    left, top, w, h = plot.left, plot.top, plot.w, plot.h
    parts = [
        f'<svg class="chart" width="{width}" height="{height}" role="img" aria-label="{esc(title)}">',
        f'<text x="{left}" y="14" class="title">{esc(title)}</text>',
        f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" class="axis"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + h}" class="axis"/>',
    ]
    for y, tick in y_ticks:
        parts.append(
            f'<text x="{left - 4}" y="{plot.sy(y) + 4:.1f}" class="tick" text-anchor="end">{tick}</text>'
        )
    for x in (plot.x0, plot.x1):
        parts.append(
            f'<text x="{plot.sx(x):.1f}" y="{top + h + 14}" class="tick" text-anchor="middle">{fmt(float(x))}</text>'
        )
    return [
        *parts,
        f'<text x="{left + w / 2}" y="{height - 4}" class="label" text-anchor="middle">{esc(x_label)}</text>',
        f'<text x="11" y="{top + h / 2}" class="label" transform="rotate(-90 11 {top + h / 2})" '
        f'text-anchor="middle">{esc(y_label)}</text>',
    ]


def _line(
    plot: _Plot, i: int, label: str, pts: Sequence[tuple[float, float]], *, legend: bool
) -> list[str]:
    """Series `i` of a chart: its line, its titled points and, with `legend`, its label."""
    color = PALETTE[i % len(PALETTE)]
    kept = sorted(p for p in pts if not any(math.isnan(v) for v in p))
    parts = []
    if len(kept) > 1:
        d = " ".join(f"{plot.sx(x):.1f},{plot.sy(y):.1f}" for x, y in kept)
        parts.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="2"/>')
    for x, y in kept:
        parts.append(
            f'<circle cx="{plot.sx(x):.1f}" cy="{plot.sy(y):.1f}" r="3" fill="{color}">'
            f"<title>{esc(label)}: {fmt(float(x))}, {fmt(float(y))}</title></circle>"
        )
    if legend:
        parts.append(
            f'<text x="{plot.left + plot.w - 4}" y="{plot.top + 12 + 12 * i}" class="legend" '
            f'text-anchor="end" fill="{color}">{esc(label)}</text>'
        )
    return parts


def page(title: str, body: str, *, runs: str, nav: Sequence[tuple[str, str]]) -> str:
    """A whole page: header with the viewed runs and the navigation (path, title), then ``body``."""
    links = " ".join(f'<a href="{p}">{esc(t)}</a>' for p, t in nav)
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)} · stacx view</title>"
        '<link rel="icon" href="data:,"><link rel="stylesheet" href="/static/view.css"><script src="/static/view.js" defer></script>'
        f'</head><body><header><b>stacx view</b> <span class="runs">{esc(runs)}</span><nav>{links}</nav>'
        f"</header><main><h1>{esc(title)}</h1>{body}</main></body></html>"
    )


def select(name: str, options: Sequence[object], current: str, *, blank: str = "any") -> str:
    """A <select> of a filter form (the empty option means "no filter")."""
    opts = [f'<option value="">{esc(blank)}</option>'] if blank else []
    for o in options:
        s = "" if o is None else str(o)
        sel = " selected" if s == current else ""
        opts.append(f'<option value="{esc(s)}"{sel}>{esc(s)}</option>')
    return f'<label>{esc(name.replace("_", " "))} <select name="{esc(name)}">{"".join(opts)}</select></label>'

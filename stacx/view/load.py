"""The time & load page: ``time_accounting_run`` beside each process's load (``process_load_run``,
``process_load_by_version``), the saturated processes named.
"""

from __future__ import annotations

from stacx.view.html import esc, table
from stacx.view.pages import Params
from stacx.view.source import Source


def load_page(source: Source, params: Params) -> str:
    parts = []
    if source.has("time_accounting_run"):
        acc = source.query("select * from time_accounting_run order by all")
        parts += ["<h2>where the time went</h2>", table(acc.columns, acc.rows)]
    if source.has("process_load_run"):
        run = source.query("select * from process_load_run order by all")
        if run.rows:
            saturated = [
                f"{r['process']} ({r['run_id']})" for r in run.dicts() if r["saturated_windows"]
            ]
            note = (
                f'<p class="error">saturated (event-loop lag p99 over 100 ms in some window): '
                f"{esc(', '.join(saturated))}</p>"
                if saturated
                else "<p>No process saturated its event loop.</p>"
            )
            by_version = source.query("select * from process_load_by_version order by all")
            parts += [
                "<h2>processes</h2>",
                note,
                table(run.columns, run.rows),
                "<h3>per weight version</h3>",
                table(by_version.columns, by_version.rows),
            ]
        else:
            parts.append(
                "<h2>processes</h2><p>No process load recorded (a log from before it was).</p>"
            )
    return "".join(parts) or "<p>The time and load views are not loaded for this log.</p>"

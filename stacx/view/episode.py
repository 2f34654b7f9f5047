"""One episode, turn by turn: the text decoded from the recorded ids with the run's tokenizer
(output tokens shaded by logprob), tool calls, the verifier's verdict, failures, sandboxes and
gateway segments. The ids are the record; decoding is for reading.

Design: docs/view.md#what-the-viewer-guarantees
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Protocol

from stacx.view.html import esc, fmt, link, table
from stacx.view.pages import BadRequest, Params
from stacx.view.source import Source


class Decoder(Protocol):
    """What decoding needs from a tokenizer (transformers' tokenizers have it)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...

    def batch_decode(self, ids: list[list[int]], skip_special_tokens: bool = ...) -> list[str]: ...


def load_tokenizer(spec: str | None) -> Decoder | None:
    """The tokenizer of a model spec, or None when it cannot be loaded (the page then shows ids)."""
    try:
        from transformers import AutoTokenizer

        from stacx.hf import resolve_model

        tok: Decoder = AutoTokenizer.from_pretrained(resolve_model(spec or "default"))  # type: ignore[assignment]
        return tok
    except Exception:  # decoding is a convenience over the recorded ids; never fail the page
        return None


def token_pieces(tok: Decoder, ids: Sequence[int]) -> list[tuple[int, int, str]]:
    """``(start, end, text)`` spans over ``ids``, one per token, except that a token decoding to
    part of a UTF-8 character is joined with the next ones (at most 4) until they decode cleanly."""
    singles = tok.batch_decode([[int(i)] for i in ids], skip_special_tokens=False)
    out, i, n = [], 0, len(ids)
    while i < n:
        j, text = i + 1, singles[i]
        while "\ufffd" in text and j < n and j - i < 4:
            j += 1
            text = tok.decode([int(x) for x in ids[i:j]], skip_special_tokens=False)
        out.append((i, j, text))
        i = j
    return out


def shade(logprob: float | None) -> str:
    """A token's background: clear when the model was sure, redder as its probability falls."""
    if logprob is None or math.isnan(logprob):
        return ""
    alpha = 0.85 * (1.0 - math.exp(min(0.0, logprob)))
    return f"background:rgba(220,38,38,{alpha:.2f})"


def output_html(
    tok: Decoder | None, ids: Sequence[int], logprobs: Sequence[float] | None, version: object
) -> str:
    """The output ids as spans shaded by logprob; title = token, logprob, weight version."""
    if tok is None:
        return f'<pre class="ids">{esc(list(ids))}</pre>'
    spans = []
    for start, end, text in token_pieces(tok, ids):
        lps = [logprobs[k] for k in range(start, end)] if logprobs and len(logprobs) >= end else []
        lp = sum(lps) if lps else None
        title = f"{text!r} · logprob {fmt(lp)} · weight v{fmt(version)} · id {list(ids[start:end])}"
        spans.append(
            f'<span class="tok" style="{shade(lp)}" title="{esc(title)}">{esc(text)}</span>'
        )
    return f'<pre class="output">{"".join(spans)}</pre>'


def _text(tok: Decoder | None, ids: Sequence[int]) -> str:
    if tok is None:
        return f'<pre class="ids">{esc(list(ids))}</pre>'
    return f'<pre class="prompt">{esc(tok.decode([int(i) for i in ids], skip_special_tokens=False))}</pre>'


TURN_SQL = """select t.turn, t.actor, t.prompt_ids, t.output_ids, t.logprobs, t.weight_version,
       t.finish_reason, t.engine, t.gen_ms, t.segment, g.request_id, g.request_json
from turns t left join turn_generated g using (event_id)
where t.episode_id = ? order by t.turn"""
TOOLS_SQL = """select c.turn, c.tool, c.call_id, c.arguments_json, r.output, r.exit_code, r.timed_out,
       r.truncated, r.error, r.duration_ms
from tool_called c left join tool_returned r using (episode_id, call_id)
where c.episode_id = ? order by c.turn, c._seq"""


SUMMARY = (  # an episode's columns in its page's summary table
    "task_id, status, reward, stop_reason, failure_kind, weight_version, n_turns, n_tool_calls, "
    "agent, policy, split, role, run_id"
)


def episode_page(source: Source, params: Params) -> str:
    eid = params.get("id") or ""
    found = source.query(f"select {SUMMARY} from episodes where episode_id = ?", [eid])
    if not found.rows:
        raise BadRequest(f"parameter id={eid!r}: no such episode in these runs")
    ep = found.dicts()[0]
    tok: Decoder | None = source.tokenizer(str(ep["run_id"]), load_tokenizer)  # type: ignore[assignment]
    cells = {"task_id": lambda v: link("/episodes", v, task=v)}
    summary = table(found.columns, found.rows[:1], cells=cells)
    parts = [f'<p class="mono">{esc(eid)}</p>', summary]
    if tok is None:
        parts.append(
            '<p class="note">The run\'s tokenizer could not be loaded: token ids are shown.</p>'
        )
    parts.append(_events_html(source, eid))
    parts.append(_turns_html(source, eid, tok))
    parts.append(_verifier_html(source, eid))
    parts.append(_lineage_html(source, eid))
    return "".join(parts)


def _lineage_html(source: Source, eid: str) -> str:
    """The weight versions trained on the episode (nothing when none was)."""
    fed = source.query(
        "select distinct weight_version from lineage where episode_id = ? order by 1", [eid]
    )
    if not fed.rows:
        return ""
    versions = ", ".join(link("/lineage", v[0], version=v[0]) for v in fed.rows)
    return (
        f"<section><h2>lineage</h2><p>Trained on by weight versions {versions} "
        f"({link('/lineage', 'details', episode=eid)}).</p></section>"
    )


def _turns_html(source: Source, eid: str, tok: Decoder | None) -> str:
    turns = source.query(TURN_SQL, [eid]).dicts()
    tools: dict[int, list[dict[str, object]]] = defaultdict(list)
    for t in source.query(TOOLS_SQL, [eid]).dicts():
        tools[int(t["turn"])].append(t)  # type: ignore[call-overload]
    out: list[str] = []
    end: list[int] = []
    for t in turns:
        prompt, output = list(t["prompt_ids"]), list(t["output_ids"])  # type: ignore[call-overload]
        extends = bool(end) and prompt[: len(end)] == end
        added = prompt[len(end) :] if extends else prompt
        seg = f" · segment {t['segment']}" if t["segment"] else ""
        head = (
            f"turn {t['turn']} · {esc(t['actor'])} · weight v{fmt(t['weight_version'])} · "
            f"{len(output)} tokens · {esc(t['finish_reason'])} · {esc(t['engine'])} · "
            f"{float(t['gen_ms'] or 0) / 1000:.1f} s{seg}"  # type: ignore[arg-type]
        )
        label = "observation and chat header" if extends else "prompt"
        if end and not extends:
            label = "whole prompt (a new segment: it does not extend the previous call)"
        body = [
            f"<details{' open' if extends else ''}><summary>{label} · {len(added)} tokens</summary>"
            f"{_text(tok, added)}</details>",
            output_html(tok, output, t["logprobs"], t["weight_version"]),  # type: ignore[arg-type]
        ]
        body += [_tool_html(c) for c in tools.get(int(t["turn"]), [])]  # type: ignore[call-overload]
        if t["request_json"]:
            body.append(
                f"<details><summary>gateway request {esc(t['request_id'])}</summary>"
                f"<pre>{esc(_pretty(str(t['request_json'])))}</pre></details>"
            )
        out.append(
            f'<section class="turn" id="turn-{t["turn"]}"><h3>{head}</h3>{"".join(body)}</section>'
        )
        end = prompt + output
    return "<h2>turns</h2>" + ("".join(out) or "<p>No turns recorded.</p>")


def _tool_html(c: dict[str, object]) -> str:
    status = "timed out" if c["timed_out"] else f"exit {fmt(c['exit_code'])}"
    flags = " · truncated" if c["truncated"] else ""
    err = f'<pre class="error">{esc(c["error"])}</pre>' if c["error"] else ""
    return (
        f'<div class="tool"><b>{esc(c["tool"])}</b> <code>{esc(c["arguments_json"])}</code> · '
        f"{status} · {fmt(c['duration_ms'])} ms{flags}{err}"
        f'<pre class="tool-output">{esc(c["output"])}</pre></div>'
    )


def _pretty(text: str) -> str:
    try:
        return json.dumps(json.loads(text), indent=2)
    except ValueError:
        return text


def _verifier_html(source: Source, eid: str) -> str:
    # the latest grade, as `episodes.reward` shows it (a `stacx regrade` names its grader)
    r = source.query(
        "select reward, metrics_json, verifier_ms, verifier_output, grader from grades "
        "where episode_id = ? and latest",
        [eid],
    ).dicts()
    if not r:
        return ""
    v = r[-1]
    by = "" if v["grader"] == "rollout" else f" · by <code>{esc(v['grader'])}</code>"
    out = f'<pre class="verifier">{esc(v["verifier_output"])}</pre>' if v["verifier_output"] else ""
    return (
        "<section><h2>verifier</h2>"
        f'<p>reward <b class="reward">{fmt(v["reward"])}</b>{by} · {fmt(v["verifier_ms"])} ms · '
        f"metrics <code>{esc(v['metrics_json'])}</code></p>{out}</section>"
    )


def _events_html(source: Source, eid: str) -> str:
    """Infrastructure failures (with their cause), warnings, failed steps and sandboxes."""
    parts = []
    fails = source.query(
        "select failure_kind, message, turn, attempt, will_retry from infra_failed "
        "where episode_id = ? order by _seq",
        [eid],
    )
    if fails.rows:
        parts.append(
            "<h3>infrastructure failures</h3>" + table(fails.columns, fails.rows, cls="failures")
        )
    parts.append(_scaffold_html(source, eid))
    for name, events, columns, join in (
        ("warnings", "episode_warned", "message", ""),
        ("failed steps", "step_failed", "step, exception_type, message", ""),
        (
            "gateway refusals",
            "gateway_refused",
            "route, status, error_type, code, param, message",
            "",
        ),
        (
            "sandboxes",
            "sandbox_started",
            "s.sandbox_id, s.image, s.start_ms, s.warm, s.host, p.reason as stop_reason, "
            "p.ts - s.ts as seconds",
            "left join sandbox_stopped p using (sandbox_id)",
        ),
    ):
        if source.has(events):  # a log older than the event kind has no table for it
            r = source.query(
                f"select {columns} from {events} s {join} where s.episode_id = ? order by s._seq",
                [eid],
            )
            if r.rows:
                parts.append(f"<h3>{name}</h3>" + table(r.columns, r.rows))
    return "".join(parts)


def _scaffold_html(source: Source, eid: str) -> str:
    """How an installed scaffold's process ended: exit code, and the tail of its stderr."""
    if not source.has("scaffold_exited"):  # a log older than the event kind
        return ""
    out = []
    for x in source.query(
        "select scaffold, exit_code, timed_out, stderr_tail from scaffold_exited "
        "where episode_id = ? order by _seq",
        [eid],
    ).dicts():
        how = "killed by the timeout" if x["timed_out"] else f"exit code {fmt(x['exit_code'])}"
        tail = x["stderr_tail"] or "(nothing on stderr)"
        out.append(
            f"<h3>scaffold {esc(x['scaffold'])}: {how}</h3>"
            f'<details open><summary>stderr (tail)</summary><pre class="stderr">{esc(tail)}</pre></details>'
        )
    return "".join(out)

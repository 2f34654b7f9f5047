"""Episodes out of a log and back in: an episode record is all of one episode's events, in stream
order; ``stacx export`` writes records and ``stacx replay`` copies them into a new run, re-keyed
(importing twice is de-duplicated) and each paired with an ``EventImported`` provenance event.
Design: docs/concepts/events.md#episodes-out-and-back-in
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import msgspec

from stacx.errors import StacxError
from stacx.events import KINDS, Event, EventImported, derive_id, full_prompts
from stacx.store import db
from stacx.store.schema import TABLES

EPISODE_KINDS = [
    k
    for k, t in TABLES.items()
    if any(c.name == "episode_id" for c in t.columns) and k not in ("InfraFailed",)
] + ["InfraFailed"]


class EpisodeRecord(msgspec.Struct, kw_only=True):
    run_id: str
    episode_id: str
    task_id: str
    group_id: str
    reward: float | None
    status: str
    events: list[dict[str, object]]  # kind-tagged event dicts, in stream order
    source_path: str = ""


def select_episodes(
    con: duckdb.DuckDBPyConnection, where: str | None
) -> list[tuple[str, str, str, str, float | None, str]]:
    """(run_id, episode_id, task_id, group_id, reward, status) of the episodes matching `where`."""
    sql = "select run_id, episode_id, task_id, group_id, reward, status from episodes"
    if where:
        sql += f" where {where}"
    try:
        return [tuple(r) for r in con.execute(sql + " order by started_ts, episode_id").fetchall()]  # type: ignore[misc]
    except duckdb.Error as exc:
        raise StacxError(
            f"--where {where!r} is not a valid predicate over the episodes view: {exc}"
        ) from exc


def read_records(run_dir: Path, where: str | None = None) -> list[EpisodeRecord]:
    """Every selected episode of one run, with all its events."""
    con = db.connect_run(run_dir)
    try:
        chosen = select_episodes(con, where)
        if not chosen:
            return []
        ids = [c[1] for c in chosen]
        con.execute(
            "create or replace temp table _chosen as select unnest(?::varchar[]) as episode_id",
            [ids],
        )
        per_episode: dict[str, list[tuple[int, dict[str, object]]]] = {i: [] for i in ids}
        # events that were themselves imported keep their first origin (replay of a replay)
        origins = dict(
            con.execute(
                "select imported_event_id, coalesce(nullif(origin_run_id, ''), source_run_id) from event_imported"
            ).fetchall()
        )
        present = {r[0] for r in con.execute("select table_name from duckdb_tables()").fetchall()}
        for kind in EPISODE_KINDS:
            t = TABLES[kind].name
            if t not in present:  # a log older than this event kind
                continue
            cur = con.execute(
                f'select * from "{t}" where episode_id in (select episode_id from _chosen)'
            )
            cols = [d[0] for d in cur.description or []]
            for row in cur.fetchall():
                d = dict(zip(cols, row, strict=True))
                seq = int(d.pop("_seq"))  # type: ignore[call-overload]
                d["kind"] = kind
                if d["event_id"] in origins:
                    d["_origin_run_id"] = origins[d["event_id"]]
                per_episode[str(d["episode_id"])].append((seq, d))
        return [
            EpisodeRecord(
                run_id=r,
                episode_id=e,
                task_id=t,
                group_id=g,
                reward=rw,
                status=st,
                events=[d for _, d in sorted(per_episode[e], key=lambda x: x[0])],
                source_path=str(run_dir),
            )
            for (r, e, t, g, rw, st) in chosen
        ]
    finally:
        con.close()


def read_export(path: Path, where: str | None = None) -> list[EpisodeRecord]:
    """Records from a `stacx export` file (.jsonl or .parquet); `where` filters like a run's."""
    if not path.is_file():
        raise StacxError(f"{path}: no such export file")
    if path.suffix in (".jsonl", ".json"):
        reader = "read_json_auto(?, format='newline_delimited', maximum_object_size=1073741824)"
    elif path.suffix == ".parquet":
        reader = "read_parquet(?, union_by_name=true)"
    else:
        raise StacxError(f"{path}: unknown export format (accepted: .jsonl, .parquet)")
    # the selection predicate runs over the same columns as the episodes view offers
    sql = f"select events_json, source_path from {reader} as episodes"
    if where:
        sql += f" where {where}"
    try:
        rows = duckdb.connect().execute(sql, [str(path)]).fetchall()
    except duckdb.Error as exc:
        raise StacxError(f"reading {path} with --where {where!r}: {exc}") from exc
    out = []
    for events_json, source_path in rows:
        events = json.loads(events_json)
        start = next((e for e in events if e["kind"] == "EpisodeStarted"), events[0])
        reward = next(
            (e["reward"] for e in reversed(events) if e["kind"] == "RewardAssigned"), None
        )
        out.append(
            EpisodeRecord(
                run_id=start["run_id"],
                episode_id=start["episode_id"],
                task_id=start.get("task_id", ""),
                group_id=start.get("group_id", ""),
                reward=reward,
                status="scored" if reward is not None else "unknown",
                events=events,
                source_path=source_path or str(path),
            )
        )
    return out


def read_sources(sources: list[Path], where: str | None) -> list[EpisodeRecord]:
    return [
        r
        for src in sources
        for r in (read_records(src, where) if src.is_dir() else read_export(src, where))
    ]


def reimport(records: list[EpisodeRecord], run_id: str) -> Iterator[Event]:
    """The events to publish into run `run_id`: each source event re-keyed, then its provenance."""
    for rec in records:
        for d in rec.events:
            kind = str(d["kind"])
            if kind not in KINDS:
                raise StacxError(
                    f"episode {rec.episode_id} from {rec.source_path}: unknown event kind {kind!r}"
                )
            src_id = str(d["event_id"])
            fields = {k: v for k, v in d.items() if not k.startswith("_") and k != "kind"}
            fields["run_id"] = run_id
            fields["event_id"] = derive_id(run_id, "import", rec.run_id, src_id)
            event = msgspec.convert(fields, KINDS[kind])
            yield event
            yield EventImported(
                run_id=run_id,
                event_id=derive_id(run_id, "provenance", rec.run_id, src_id),
                ts=event.ts,  # deterministic: the same import twice is the same event
                imported_event_id=event.event_id,
                source_run_id=rec.run_id,
                source_event_id=src_id,
                source_path=rec.source_path,
                origin_run_id=str(d.get("_origin_run_id") or rec.run_id),
            )


# ---- export ---------------------------------------------------------------------------------


def _chatml_messages(text: str) -> list[dict[str, str]]:
    """Split ChatML text (`<|im_start|>role\\n...<|im_end|>`) into messages; [] if not ChatML."""
    out = []
    for chunk in text.split("<|im_start|>")[1:]:
        role, _, body = chunk.partition("\n")
        out.append({"role": role.strip(), "content": body.split("<|im_end|>")[0].rstrip("\n")})
    return out


def whole_turns(turns: list[dict[str, object]]) -> list[dict[str, object]]:
    """TurnGenerated dicts of one episode, in turn order, with whole ``prompt_ids`` (undoing
    ``prefix_len``: ``stacx.events.full_prompts``). ValueError on a chain missing a turn."""
    ordered = sorted(turns, key=lambda t: int(t["turn"]))  # type: ignore[call-overload]
    prompts = full_prompts(
        [
            (
                int(t["turn"]),  # type: ignore[call-overload]
                int(t.get("prefix_len") or 0),  # type: ignore[call-overload]
                list(t["prompt_ids"]),  # type: ignore[call-overload]
                list(t["output_ids"]),  # type: ignore[call-overload]
            )
            for t in ordered
        ]
    )
    return [{**t, "prompt_ids": p, "prefix_len": 0} for t, p in zip(ordered, prompts, strict=True)]


def export_row(
    rec: EpisodeRecord, decode: Callable[[list[int]], str] | None = None
) -> dict[str, object]:
    """One export row: the episode's token trajectory, its reward, its events. `loss_mask` is 1
    (and `logprobs` set) on model-produced tokens; `input_ids` restart where a prompt does not
    extend the previous turn (``contiguous`` False)."""
    turns = whole_turns([e for e in rec.events if e["kind"] == "TurnGenerated"])
    input_ids: list[int] = []
    loss_mask: list[int] = []
    logprobs: list[float | None] = []
    contiguous = True
    for t in turns:
        prompt = list(t["prompt_ids"])  # type: ignore[call-overload]
        out = list(t["output_ids"])  # type: ignore[call-overload]
        lps = t.get("logprobs") or [None] * len(out)
        if input_ids and prompt[: len(input_ids)] != input_ids:
            contiguous = False
        if not contiguous:
            input_ids, loss_mask, logprobs = [], [], []
        new = prompt[len(input_ids) :]
        input_ids += new + out
        loss_mask += [0] * len(new) + [1] * len(out)
        logprobs += [None] * len(new) + list(lps)  # type: ignore[call-overload]
    messages = _chatml_messages(decode(input_ids)) if decode and input_ids else []
    return {
        "run_id": rec.run_id,
        "episode_id": rec.episode_id,
        "task_id": rec.task_id,
        "group_id": rec.group_id,
        "reward": rec.reward,
        "status": rec.status,
        "n_turns": len(turns),
        "contiguous": contiguous,
        "messages": json.dumps(messages),
        "input_ids": input_ids,
        "loss_mask": loss_mask,
        "logprobs": logprobs,
        "events_json": json.dumps(rec.events, default=str),
        "source_path": rec.source_path,
    }


def write_export(rows: list[dict[str, object]], path: Path, fmt: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        with path.open("w") as f:
            for r in rows:
                f.write(json.dumps(r, default=str) + "\n")
    elif fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        raise StacxError(f"unknown export format {fmt!r} (accepted: jsonl, parquet)")

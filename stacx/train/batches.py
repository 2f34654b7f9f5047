"""From view rows (Arrow) to training samples and packed or padded torch batches.

The views in ``events/views/`` (``sft_examples``, ``grpo_batch``, ``dagger_dataset``,
``aggrevate_dataset``, ``opd_batch``) each give one row per (episode, turn) with the exact token
ids the engine saw and produced. :func:`samples_from_table` turns rows into
:class:`~stacx.train.packing.Sample`s, naming which columns carry per-token values (one float
per completion id, e.g. ``behavior_logprobs``) and which carry one value per row to broadcast
over the completion (e.g. the episode's GRPO ``advantage``). :func:`read_batch` runs a query
and packs the result.

Multi-turn episodes train as one sequence per episode (segment): :func:`episode_sequences`
merges rows that carry whole prompts; for the views whose prompts come from ``turns``, the
trainer reads the rows without them (:func:`linear_columns`) and :func:`chained_sequences`
builds the same sequences from the stored deltas (:func:`turn_prompts`), in time and memory
linear in the ids ``turn_generated`` holds.

Guarantees: a NULL where a value is needed, or a per-token list whose length differs from the
completion's, raises :class:`BatchError` naming the column and the row's episode and turn;
nothing is silently dropped or padded. Limits: the whole result is materialized in memory
(a training batch, not a dataset scan).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import duckdb
import pyarrow as pa

from stacx.errors import StacxError
from stacx.train.packing import PackedBatch, Sample, pack


class BatchError(StacxError):
    """View rows cannot be turned into training samples."""


def _where(rows: dict[str, list[object]], i: int) -> str:
    parts = [f"row {i}"]
    for key in ("episode_id", "turn"):
        if key in rows:
            parts.append(f"{key}={rows[key][i]}")
    return ", ".join(parts)


def samples_from_table(
    table: pa.Table,
    *,
    prompt: str = "prompt_ids",
    completion: str = "completion_ids",
    token_columns: Mapping[str, str] | None = None,
    scalar_columns: Mapping[str, str] | None = None,
    loss_mask: str | None = None,
) -> list[Sample]:
    """One :class:`Sample` per row.

    ``token_columns`` maps a value name to a LIST column with one float per completion id;
    ``scalar_columns`` maps a value name to a numeric column broadcast over the completion.
    ``loss_mask`` names a 0/1 LIST column over ``prompt || completion`` (the views' layout);
    its prompt part must be all 0 (training on prompt ids is not supported).
    """
    token_columns = dict(token_columns or {})
    scalar_columns = dict(scalar_columns or {})
    clash = set(token_columns) & set(scalar_columns)
    if clash:
        raise BatchError(f"value names given as both token and scalar columns: {sorted(clash)}")
    wanted = [prompt, completion, *token_columns.values(), *scalar_columns.values()]
    wanted += [loss_mask] if loss_mask else []
    wanted += [c for c in ("episode_id", "turn") if c in table.column_names]
    missing = sorted({c for c in wanted if c not in table.column_names})
    if missing:
        raise BatchError(f"columns {missing} not in the result; it has {table.column_names}")
    rows: dict[str, list[object]] = {c: table.column(c).to_pylist() for c in set(wanted)}
    samples = []
    for i in range(table.num_rows):
        prompt_ids = rows[prompt][i]
        completion_ids = rows[completion][i]
        if not isinstance(prompt_ids, list) or not isinstance(completion_ids, list):
            raise BatchError(f"{_where(rows, i)}: {prompt} or {completion} is NULL")
        n = len(completion_ids)
        values: dict[str, Sequence[float]] = {}
        for name, col in token_columns.items():
            v = rows[col][i]
            if not isinstance(v, list) or len(v) != n or any(x is None for x in v):
                got = "NULL" if v is None else f"{len(v)} values" if isinstance(v, list) else v
                raise BatchError(
                    f"{_where(rows, i)}: column {col!r} needs {n} floats (one per completion id), "
                    f"got {got}"
                )
            values[name] = v
        for name, col in scalar_columns.items():
            x = rows[col][i]
            if not isinstance(x, int | float):
                raise BatchError(f"{_where(rows, i)}: column {col!r} is {x!r}, not a number")
            values[name] = [float(x)] * n
        mask = None
        if loss_mask is not None:
            full = rows[loss_mask][i]
            if not isinstance(full, list) or len(full) != len(prompt_ids) + n:
                raise BatchError(
                    f"{_where(rows, i)}: {loss_mask!r} must cover prompt and completion "
                    f"({len(prompt_ids) + n} entries)"
                )
            if any(full[: len(prompt_ids)]):
                raise BatchError(f"{_where(rows, i)}: {loss_mask!r} marks prompt ids for training")
            mask = full[len(prompt_ids) :]
        samples.append(Sample(prompt_ids, completion_ids, values, mask))
    return samples


def episode_sequences(samples: Sequence[Sample], episodes: Sequence[object]) -> list[Sample]:
    """Consecutive samples of one episode (``episodes[i]`` names sample i's; rows in turn
    order) merged into one sequence while each prompt extends the sequence so far token-exactly:
    the merged sample's prompt is the first turn's, its completion is every later id (the
    model's outputs and, between them, the new prompt ids: observations, chat headers), with
    the loss mask and per-token values of the outputs where they were and 0 on the new prompt
    ids. Every loss is a token sum over the mask (``stacx.train.losses``), so the merged
    samples give the same logprobs, losses and gradients as the per-turn ones while their
    forward costs the episode's length once instead of once per turn.

    A prompt that does not extend the sequence (a rewritten history: a new gateway segment, a
    DAgger label instead of the executed action, a turn left out by a filter whose ids are
    not in the next prompt) starts a new sequence; nothing is ever merged on a guess.

    This takes whole prompts (the views' rows); :func:`chained_sequences` gives the same
    sequences from the stored deltas, without materializing a whole prompt per turn."""
    if len(samples) != len(episodes):
        raise BatchError(f"{len(samples)} samples but {len(episodes)} episode ids")
    prompts = [(list(s.prompt_ids), len(s.prompt_ids)) for s in samples]
    return _merge(samples, episodes, prompts)


# The training views whose prompt_ids is the `turns` view's whole prompt of the row's (episode,
# turn) and whose completion is that turn's output_ids, with what a linear read puts in place of
# the columns computed from the whole prompt (sft_examples' loss_mask is a 0 per prompt id, then
# a 1 per completion id, so its completion part is all 1). dagger_dataset's prompts are the
# labels' own (TeacherLabeled stores them whole), so it is not one of them.
TURN_PROMPT_VIEWS: Final[dict[str, dict[str, str]]] = {
    "sft_examples": {"loss_mask": "[1 for _x in completion_ids]"},
    "grpo_batch": {},
    "opd_batch": {},
    "aggrevate_dataset": {},
}

# Every stored turn of the chosen episodes, as turn_generated holds it (a turn's new prompt ids
# after prefix_len; NULL prefix_len: a row older than the column, stored whole).
STORED_TURNS_SQL: Final = (
    "SELECT episode_id, turn, coalesce(prefix_len, 0) AS prefix_len, prompt_ids, output_ids "
    "FROM turn_generated WHERE list_contains($episode_ids, episode_id) ORDER BY episode_id, turn"
)


def linear_columns(view: str) -> str | None:
    """The select list that reads training view `view` without its whole prompts
    (``prompt_ids`` is ``[]``, see :data:`TURN_PROMPT_VIEWS`), for :func:`chained_sequences`;
    None when `view` is not one of those views as the project defines them (a view file of
    ``STACX_VIEWS_PATH`` that names it may define it otherwise: then the whole prompts are read)."""
    if view not in TURN_PROMPT_VIEWS:
        return None
    from stacx.store.db import VIEWS_DIR, view_files

    if any(f.parent != VIEWS_DIR and view in f.read_text() for f in view_files()):
        return None
    replaced = {"prompt_ids": "[]::INTEGER[]", **TURN_PROMPT_VIEWS[view]}
    return "* REPLACE (" + ", ".join(f"{e} AS {c}" for c, e in replaced.items()) + ")"


Prompt = tuple[list[int], int]
"""A whole prompt as ``(ids, n)``: the prompt is ``ids[:n]``. The turns of one chain (a turn
stored whole and the turns stored after it with ``prefix_len``) share one ``ids`` list."""


def turn_prompts(stored: pa.Table) -> dict[tuple[object, int], Prompt]:
    """Each stored turn's whole prompt, keyed by (episode_id, turn), from
    :data:`STORED_TURNS_SQL`'s rows: one list per chain, built once, so this is linear in the
    stored ids. The ``turns`` view's rule: a turn with ``prefix_len`` > 0 continues turn - 1's
    prompt + output, which must be exactly ``prefix_len`` ids long; a missing turn or a
    different length raises :class:`BatchError` (never a wrong prompt)."""
    cols = [stored.column(c).to_pylist() for c in ("episode_id", "turn", "prefix_len")]
    prompts, outputs = (stored.column(c).to_pylist() for c in ("prompt_ids", "output_ids"))
    out: dict[tuple[object, int], Prompt] = {}
    ids: list[int] = []
    last: tuple[object, int] | None = None
    for i, (episode, turn, prefix_len) in enumerate(zip(*cols, strict=True)):
        if (episode, turn) in out:
            raise BatchError(f"episode {episode} turn {turn}: stored twice in turn_generated")
        if prefix_len:
            if last != (episode, turn - 1) or prefix_len != len(ids):
                raise BatchError(
                    f"episode {episode} turn {turn} has prefix_len {prefix_len} but turn "
                    f"{turn - 1} is missing or differs in length"
                )
        else:
            ids = []  # a new chain
        ids.extend(prompts[i] or [])
        out[(episode, turn)] = (ids, len(ids))
        ids.extend(outputs[i] or [])
        last = (episode, turn)
    return out


def chained_sequences(
    samples: Sequence[Sample],
    keys: Sequence[tuple[object, int]],
    prompts: Mapping[tuple[object, int], Prompt],
) -> list[Sample]:
    """:func:`episode_sequences` for samples read without their prompts (``prompt_ids`` empty,
    see :func:`linear_columns`): sample i's whole prompt is ``prompts[keys[i]]`` (``keys[i]``
    its (episode, turn), `prompts` from :func:`turn_prompts`). Within a chain a later turn's
    prompt extends an earlier turn's prompt + output by construction, so it merges after a
    check of the sample's completion against the stored output (O(output)); across chains (a
    rewritten history, a log that stores every prompt whole) the prompts are compared token by
    token, as :func:`episode_sequences` does. Same sequences, linear in the stored ids."""
    if len(samples) != len(keys):
        raise BatchError(f"{len(samples)} samples but {len(keys)} (episode, turn) keys")
    whole = []
    for sample, key in zip(samples, keys, strict=True):
        if sample.prompt_ids:
            raise BatchError(
                f"episode {key[0]} turn {key[1]}: a prompt was read (see linear_columns)"
            )
        if key not in prompts:
            raise BatchError(f"episode {key[0]} turn {key[1]}: no such turn in turn_generated")
        whole.append(prompts[key])
    return _merge(samples, [k[0] for k in keys], whole)


def _merge(
    samples: Sequence[Sample], episodes: Sequence[object], prompts: Sequence[Prompt]
) -> list[Sample]:
    """The merge of :func:`episode_sequences`, sample i's whole prompt being
    ``prompts[i][0][:prompts[i][1]]`` (its own ``prompt_ids`` are not read)."""
    out: list[Sample] = []
    seq: list[int] = []  # the current sequence: prompt + completion so far
    n_prompt = 0
    chain: list[int] | None = None  # when set, seq == chain[:len(seq)]
    mask: list[int] = []
    values: dict[str, list[float]] = {}
    current: object = None
    started = False

    def close() -> None:
        if started:
            out.append(Sample(seq[:n_prompt], seq[n_prompt:], values, mask))

    for sample, episode, (ids, n) in zip(samples, episodes, prompts, strict=True):
        end = len(seq)
        if started and episode == current and n >= end and (ids is chain or ids[:end] == seq):
            gap = ids[end:n]
            seq += gap
            mask += [0] * len(gap)
            for name in values:
                values[name] += [0.0] * len(gap)
        else:
            close()
            started, current, seq, n_prompt, mask = True, episode, ids[:n], n, []
            values = {name: [] for name in sample.token_values}
        if sorted(sample.token_values) != sorted(values):
            raise BatchError(
                f"episode {episode}: token values {sorted(sample.token_values)} differ from "
                f"the sequence's {sorted(values)}"
            )
        completion = list(sample.completion_ids)
        # the chain's next ids are this turn's output: later turns of the chain extend seq
        chain = ids if ids[n : n + len(completion)] == completion else None
        seq += completion
        mask += [1] * len(completion) if sample.loss_mask is None else list(sample.loss_mask)
        for name, v in sample.token_values.items():
            values[name] += list(v)
    close()
    return out


def read_batch(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    params: Sequence[object] | None = None,
    *,
    row_tokens: int,
    one_per_row: bool = False,
    pad_to: int = 1,
    prompt: str = "prompt_ids",
    completion: str = "completion_ids",
    token_columns: Mapping[str, str] | None = None,
    scalar_columns: Mapping[str, str] | None = None,
    loss_mask: str | None = None,
) -> PackedBatch:
    """Run ``sql`` (e.g. ``select * from grpo_batch where staleness <= 1``) and pack its rows;
    ``one_per_row=True`` gives a padded batch instead. Raises :class:`BatchError` on an empty
    result."""
    table = con.sql(sql, params=list(params) if params else None).to_arrow_table()
    if table.num_rows == 0:
        raise BatchError(f"query returned no rows: {sql}")
    samples = samples_from_table(
        table,
        prompt=prompt,
        completion=completion,
        token_columns=token_columns,
        scalar_columns=scalar_columns,
        loss_mask=loss_mask,
    )
    return pack(samples, row_tokens, one_per_row=one_per_row, pad_to=pad_to)


def opd_advantage_lists(
    table: pa.Table, *, discount: float = 0.0, grpo_weight: float = 0.0, center: bool = False
) -> pa.Table:
    """``opd_batch`` rows with ``advantages`` recomputed by
    :func:`stacx.train.advantages.opd_advantages` (``discount``, ``center`` over the table's
    tokens, ``grpo_weight * grpo_advantage``) from the rows' ``teacher_logprobs`` and
    ``student_logprobs``. Rows that are not ``aligned`` keep NULL. This is the one OPD
    advantage the trainer uses; the view's own ``advantages`` column (the plain per-token log
    ratio) is a reading aid for users and the test oracle for every knob off."""
    import torch

    from stacx.train.advantages import opd_advantages

    cols = {
        c: table.column(c).to_pylist()
        for c in ("aligned", "teacher_logprobs", "student_logprobs", "grpo_advantage")
    }
    rows = [i for i in range(table.num_rows) if cols["aligned"][i]]
    width = max((len(cols["student_logprobs"][i]) for i in rows), default=0)
    teacher, student, mask, grpo = (
        torch.zeros(len(rows), width, dtype=torch.float64) for _ in range(4)
    )
    for r, i in enumerate(rows):
        n = len(cols["student_logprobs"][i])
        teacher[r, :n] = torch.tensor(cols["teacher_logprobs"][i], dtype=torch.float64)
        student[r, :n] = torch.tensor(cols["student_logprobs"][i], dtype=torch.float64)
        mask[r, :n] = 1.0
        grpo[r, :] = cols["grpo_advantage"][i] or 0.0
    adv = opd_advantages(
        teacher,
        student,
        mask,
        grpo_advantages_B_T=grpo,
        grpo_coef=grpo_weight,
        discount=discount,
        center=center,
    )
    out: list[list[float] | None] = [None] * table.num_rows
    for r, i in enumerate(rows):
        out[i] = adv[r, : len(cols["student_logprobs"][i])].tolist()
    index = table.column_names.index("advantages")
    return table.set_column(index, "advantages", pa.array(out, pa.list_(pa.float64())))

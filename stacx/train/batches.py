"""From view rows (Arrow) to training samples: list columns as numpy buffers, no Python object
per token.

The views in ``events/views/`` (``sft_examples``, ``grpo_batch``, ``dagger_dataset``,
``aggrevate_dataset``, ``opd_batch``) each give one row per (episode, turn) with the exact token
ids the engine saw and produced, and the masks and values the trainer needs: ``loss_mask``
covers the completion only, per-token values (``behavior_logprobs``, ``advantages``) have one
float per completion id. ``stacx.train.columns.samples_from_table`` reads each LIST column once
through its Arrow buffers and gives :class:`~stacx.train.packing.Sample`\\ s whose fields are
numpy views of them; :func:`samples_for` names the columns per algorithm; :func:`read_batch`
runs a query and packs.

Multi-turn episodes train as one sequence per episode (segment). Whole prompts are rebuilt in
ONE place, the SQL view ``turn_links`` (``events/views/01_turns.sql``): ``turns.prompt_ids``
slices them from ``turn_chains``, and :func:`step_batch` reads the same ``turn_chains`` rows
(each stored id once) and slices each row's prompt as ``chain[:n_prompt_tokens]``: every
training view carries ``chain_turn`` and ``n_prompt_tokens`` (a view without them is refused,
naming them). Turns merge into one sequence along their chain only, never by comparing
prompts (:func:`chain_sequences`).

Guarantees: a NULL where a value is needed, or a per-token list whose length differs from the
completion's, raises :class:`BatchError` naming the column and the row's episode and turn;
nothing is silently dropped or padded. Limits: the whole result is materialized in memory
(a training batch, not a dataset scan).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stacx.train.columns import BatchError, list_buffers, samples_from_table
from stacx.train.config import TrainerConfig
from stacx.train.packing import PackedBatch, Sample, pack
from stacx.train.units import batch_rows_sql

# The columns a view carries when its prompts are its chain's ids (see the module docstring).
CHAIN_COLUMNS: Final = ("chain_turn", "n_prompt_tokens")

# The chains of the chosen episodes: each stored id once (turn_links' rule, see 01_turns.sql).
CHAINS_SQL: Final = (
    "SELECT episode_id, chain_turn, ids FROM turn_chains "
    "WHERE list_contains($episode_ids, episode_id)"
)


def samples_for(
    cfg: TrainerConfig, table: pa.Table, *, prompt: str | None = "prompt_ids"
) -> list[Sample]:
    """Training samples from the source view's rows, per the algorithm's column layout."""
    return cfg.algo.samples(cfg, table, prompt=prompt)


Prompt = tuple[np.ndarray, int, tuple[object, int]]
"""A whole prompt as ``(ids, n, chain)``: the prompt is ``ids[:n]``, ``ids`` the chain's ids,
``chain`` its key (episode_id, chain_turn)."""


def chains_from_table(table: pa.Table) -> dict[tuple[object, int], np.ndarray]:
    """:data:`CHAINS_SQL`'s rows: each chain's ids keyed by (episode_id, chain_turn)."""
    offsets, ids, _ = list_buffers(table, "ids")
    keys = zip(
        table.column("episode_id").to_numpy(zero_copy_only=False).tolist(),
        table.column("chain_turn").to_numpy(zero_copy_only=False).tolist(),
        strict=True,
    )
    return {key: ids[offsets[i] : offsets[i + 1]] for i, key in enumerate(keys)}


def chain_prompts(
    samples: Sequence[Sample],
    keys: Sequence[tuple[object, int]],
    n_prompt: Sequence[int],
    chains: Mapping[tuple[object, int], np.ndarray],
) -> list[Prompt]:
    """Each sample's whole prompt in its chain: ``chains[keys[i]][:n_prompt[i]]`` (``keys[i]``
    its (episode, chain_turn)); BatchError naming the episode when the chain is not there."""
    if not len(samples) == len(keys) == len(n_prompt):
        raise BatchError(f"{len(samples)} samples but {len(keys)} chain keys, {len(n_prompt)} n")
    prompts: list[Prompt] = []
    for sample, key, n in zip(samples, keys, n_prompt, strict=True):
        if len(sample.prompt_ids):
            raise BatchError(f"episode {key[0]}: a prompt was read with its chain")
        chain = chains.get(key)
        if chain is None or n is None or n > len(chain):
            raise BatchError(
                f"episode {key[0]} chain at turn {key[1]}: not in turn_chains with {n} prompt ids"
            )
        prompts.append((chain, int(n), key))
    return prompts


def chain_sequences(
    samples: Sequence[Sample],
    keys: Sequence[tuple[object, int]],
    n_prompt: Sequence[int],
    chains: Mapping[tuple[object, int], np.ndarray],
) -> list[Sample]:
    """Consecutive samples of one chain (rows in turn order, read without their prompts; see
    :func:`chain_prompts`) merged into one sequence: the merged sample's prompt is the first
    turn's, its completion every later id of the chain (the model's outputs and, between them,
    the new prompt ids: observations, chat headers, a turn the view left out), with the loss
    mask and per-token values of the outputs where they were and 0 on the other ids. Every loss
    is a token sum over the mask (``stacx.train.losses``), so the merged samples give the same
    logprobs, losses and gradients as the per-turn ones while their forward costs the chain's
    length once instead of once per turn.

    Within a chain a later turn's prompt extends an earlier turn's prompt + output by
    construction; a merge only checks that the sample's completion is the chain's next ids
    (O(output)). A row whose completion is not (a DAgger label in place of the executed action)
    ends the sequence, and so does a new chain (a rewritten history, or a log that stored every
    prompt whole): nothing is ever merged by comparing prompts."""
    return _merge(samples, [k[0] for k in keys], chain_prompts(samples, keys, n_prompt, chains))


def _cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


@dataclass
class _Sequence:
    """One merged sequence being built: its ids, mask and values as lists of numpy pieces."""

    n_prompt: int
    ids: list[np.ndarray]
    length: int
    mask: list[np.ndarray]
    values: dict[str, list[np.ndarray]]

    def extend(self, ids: np.ndarray, mask: np.ndarray, values: Mapping[str, np.ndarray]) -> None:
        self.ids.append(ids)
        self.length += len(ids)
        self.mask.append(mask)
        for name, parts in self.values.items():
            parts.append(values[name] if name in values else np.zeros(len(ids), np.float32))

    def sample(self) -> Sample:
        ids = _cat(self.ids, np.int64)
        values = {k: _cat(v, np.float32) for k, v in self.values.items()}
        return Sample(ids[: self.n_prompt], ids[self.n_prompt :], values, _cat(self.mask, np.int8))


def _merge(
    samples: Sequence[Sample], episodes: Sequence[object], prompts: Sequence[Prompt]
) -> list[Sample]:
    """The merge of :func:`chain_sequences`, sample i's whole prompt being ``prompts[i]``
    (its own ``prompt_ids`` are not read)."""
    out: list[Sample] = []
    seq: _Sequence | None = None
    current: object = None
    chain: object = None  # when set, the sequence is chain's ids[:seq.length]
    for sample, episode, (ids, n, key) in zip(samples, episodes, prompts, strict=True):
        if seq is not None and episode == current and key == chain and n >= seq.length:
            gap = ids[seq.length : n]
            seq.extend(gap, np.zeros(len(gap), np.int8), {})
        else:
            if seq is not None:
                out.append(seq.sample())
            names: dict[str, list[np.ndarray]] = {name: [] for name in sample.token_values}
            seq, current = _Sequence(n, [ids[:n]], n, [], names), episode
        if sorted(sample.token_values) != sorted(seq.values):
            raise BatchError(
                f"episode {episode}: token values {sorted(sample.token_values)} differ from "
                f"the sequence's {sorted(seq.values)}"
            )
        completion = np.asarray(sample.completion_ids)
        # the chain's next ids are this turn's output: later turns of the chain extend seq
        same = np.array_equal(ids[n : n + len(completion)], completion)
        chain = key if same else None
        mask = sample.loss_mask
        seq.extend(
            completion,
            np.ones(len(completion), np.int8) if mask is None else np.asarray(mask, np.int8),
            {k: np.asarray(v, np.float32) for k, v in sample.token_values.items()},
        )
    if seq is not None:
        out.append(seq.sample())
    return out


Query = Callable[[str, dict[str, object]], Awaitable[pa.Table]]


@dataclass(frozen=True)
class StepBatch:
    table: pa.Table  # the source view's rows (without prompts when read with their chains)
    samples: list[Sample]  # what the step forwards: packed sequences or one per row
    n_rows: int  # the rows the step trains on
    prompt_ids_read: int  # prompt ids the queries materialized (whole prompts or chain ids)


async def step_batch(
    cfg: TrainerConfig, query: Query, episode_ids: list[str], *, version: int | None = None
) -> StepBatch:
    """The step's rows of the source view (``units.batch_rows_sql``, read without their whole
    prompts) and its training samples, read with `query` (the actor's ``query``): each row's
    prompt is cut from its chain (:data:`CHAINS_SQL`), so Arrow and the merge are linear in
    the turns' stored ids. With ``pack_episodes`` the turns of one chain are one sequence
    (:func:`chain_sequences`); without, one sample per row.

    Samples of an algorithm with ``token_versions`` (GRPO, RLOO, OPD) carry each output token's
    weight version (token value ``weight_version``, from the ``turn_versions`` view: a turn
    generated across a weight load has tokens of two versions); with `version` (the
    trainer's), tokens more than ``cfg.staleness_limit`` versions behind it get loss mask 0
    (the staleness bound, per token)."""
    chosen: dict[str, object] = {"episode_ids": sorted(set(episode_ids))}
    table = await query(batch_rows_sql(cfg, "* EXCLUDE (prompt_ids)"), chosen)
    missing = [c for c in CHAIN_COLUMNS if c not in table.column_names]
    if missing:
        raise BatchError(
            f"trainer.source = {cfg.source_view!r}: the view has no {missing} (a training view "
            "says where each row's prompt is in turn_chains; see events/views/20_sft_examples.sql)"
        )
    samples = samples_for(cfg, table, prompt=None)
    if cfg.algo.token_versions and "turn" in table.column_names:
        versions = await query(TOKEN_VERSIONS_SQL, chosen)
        samples = with_token_versions(cfg, table, samples, versions, version)
    n_rows = len(samples)  # what the step trains on; packing changes the forward, not that
    stored = await query(CHAINS_SQL, chosen)
    episodes = table.column(cfg.algo.episode_column).to_pylist()
    turns = table.column("chain_turn").to_pylist()
    n_prompt = table.column("n_prompt_tokens").to_pylist()
    keys = list(zip(episodes, turns, strict=True))
    chains = chains_from_table(stored)
    if cfg.pack_episodes:
        samples = chain_sequences(samples, keys, n_prompt, chains)
    else:
        prompts = chain_prompts(samples, keys, n_prompt, chains)
        samples = [
            replace(s, prompt_ids=ids[:n]) for s, (ids, n, _) in zip(samples, prompts, strict=True)
        ]
    return StepBatch(table, samples, n_rows, _n_ids(stored, "ids"))


# each output token's version, for the turns that span a weight load only (the others' tokens
# are all their row's weight_version: no per-token list is built or read for them)
TOKEN_VERSIONS_SQL: Final = (
    "SELECT episode_id, turn, list_transform(token_versions, lambda v: coalesce(v, 0)) AS token_versions "
    "FROM turn_versions WHERE len(versions) > 1 AND list_contains($episode_ids, episode_id)"
)


def with_token_versions(
    cfg: TrainerConfig,
    table: pa.Table,
    samples: list[Sample],
    versions: pa.Table,
    version: int | None,
) -> list[Sample]:
    """`samples` (one per row of `table`) with the ``weight_version`` of each completion token
    (numpy views of `versions`' Arrow buffers) and, given the trainer's `version`, loss mask 0 on
    tokens more than ``staleness_limit`` versions older than it. A row of one version (not in
    `versions`), or whose stored versions do not match its completion's length (a view that
    rewrote the output), takes its row's ``weight_version`` for every token."""
    offsets, flat, _ = list_buffers(versions, "token_versions")
    flat = flat.astype(np.float64)
    keys = zip(
        versions.column("episode_id").to_numpy(zero_copy_only=False),
        versions.column("turn").to_numpy(zero_copy_only=False),
        strict=True,
    )
    by_turn = {(e, int(t)): flat[offsets[i] : offsets[i + 1]] for i, (e, t) in enumerate(keys)}
    episodes = table.column(cfg.algo.episode_column).to_numpy(zero_copy_only=False)
    turns = table.column("turn").to_numpy(zero_copy_only=False)
    has_row_v = "weight_version" in table.column_names
    row_v = table.column("weight_version").to_numpy(zero_copy_only=False) if has_row_v else None
    floor = None if version is None else version - cfg.staleness_limit
    out = []
    for i, sample in enumerate(samples):
        n = len(sample.completion_ids)
        tv = by_turn.get((episodes[i], int(turns[i])))
        if tv is None or len(tv) != n:
            v = row_v[i] if row_v is not None and row_v[i] is not None else 0
            tv = np.full(n, float(v))
        mask = sample.loss_mask
        if floor is not None and n and tv.min() < floor:
            base = np.ones(n, np.int64) if mask is None else np.asarray(mask, np.int64)
            mask = np.where(tv >= floor, base, 0)
        values = {**sample.token_values, "weight_version": tv}
        out.append(replace(sample, token_values=values, loss_mask=mask))
    return out


def _n_ids(table: pa.Table, name: str) -> int:
    if name not in table.column_names:
        return 0
    return int(pc.sum(pc.list_value_length(table.column(name))).as_py() or 0)


def scalar_rows(table: pa.Table) -> list[dict[str, Any]]:
    """A small query result as one dict per row; a LIST of numbers is refused (a token array is
    never turned into Python objects: read it with :func:`list_buffers`)."""
    lists = [
        f.name
        for f in table.schema
        if pa.types.is_list(f.type)
        and (pa.types.is_integer(f.type.value_type) or pa.types.is_floating(f.type.value_type))
    ]
    if lists:
        raise BatchError(f"scalar_rows: columns {lists} are token lists")
    cols = table.to_pydict()
    return [dict(zip(cols, r, strict=True)) for r in zip(*cols.values(), strict=True)]


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

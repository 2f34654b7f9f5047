"""From view rows (Arrow) to training samples and packed batches, with no Python object per token:
each prompt is cut from its chain (``turn_chains``), and turns merge into one sequence along their
chain only, never by comparing prompts. Guarantees: a NULL where a value is needed, or a per-token
list of the wrong length, raises :class:`BatchError` naming the column, episode and turn; nothing is
dropped or padded.
Design: docs/training.md#multi-turn-episodes
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stacx.train.algorithms import algorithm_for, source_view
from stacx.train.columns import BatchError, list_buffers
from stacx.train.config import TrainerConfig
from stacx.train.packing import Sample, concat
from stacx.train.units import batch_rows_sql

# The columns every training view carries: its prompts are cut from its chain's ids.
CHAIN_COLUMNS: Final = ("chain_turn", "n_prompt_tokens")

# The chains of the chosen episodes: each stored id once (turn_links' rule, see 01_turns.sql).
CHAINS_SQL: Final = (
    "SELECT episode_id, chain_turn, ids FROM turn_chains "
    "WHERE list_contains($episode_ids, episode_id)"
)


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
    """Each sample's whole prompt, ``chains[keys[i]][:n_prompt[i]]``; BatchError naming the episode
    when the chain is missing."""
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
    """Consecutive samples of one chain merged into one sequence: the first prompt, then every later
    id of the chain, the outputs keeping their mask and values and the ids between them 0. Same
    losses and gradients as per turn; a completion that is not the chain's next ids ends the
    sequence."""
    return _merge(samples, [k[0] for k in keys], chain_prompts(samples, keys, n_prompt, chains))


@dataclass
class _Sequence:
    """One merged sequence being built, as lists of numpy pieces."""

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
        ids = concat(self.ids, np.int64)
        values = {k: concat(v, np.float32) for k, v in self.values.items()}
        return Sample(
            ids[: self.n_prompt], ids[self.n_prompt :], values, concat(self.mask, np.int8)
        )


def _merge(
    samples: Sequence[Sample], episodes: Sequence[object], prompts: Sequence[Prompt]
) -> list[Sample]:
    """The merge of :func:`chain_sequences`, sample i's whole prompt being ``prompts[i]``."""
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
    """The step's rows and samples, prompts cut from their chains (``pack_episodes``: one sequence
    per chain); tokens more than ``cfg.staleness_limit`` behind `version` get loss mask 0."""
    a = algorithm_for(cfg)
    chosen: dict[str, object] = {"episode_ids": sorted(set(episode_ids))}
    table = await query(batch_rows_sql(cfg, "* EXCLUDE (prompt_ids)"), chosen)
    missing = [c for c in CHAIN_COLUMNS if c not in table.column_names]
    if missing:
        raise BatchError(
            f"trainer.source = {source_view(cfg)!r}: the view has no {missing} (a training view "
            "says where each row's prompt is in turn_chains; see events/views/20_sft_examples.sql)"
        )
    samples = a.samples(cfg, table, prompt=None)
    if a.token_versions and "turn" in table.column_names:
        versions = await query(TOKEN_VERSIONS_SQL, chosen)
        samples = with_token_versions(cfg, table, samples, versions, version)
    n_rows = len(samples)  # what the step trains on; packing changes the forward, not that
    stored = await query(CHAINS_SQL, chosen)
    episodes = table.column(a.episode_column).to_pylist()
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
    n_ids = int(pc.sum(pc.list_value_length(stored.column("ids"))).as_py() or 0)
    return StepBatch(table, samples, n_rows, n_ids)


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
    """`samples` with each completion token's ``weight_version`` (a row absent from `versions`, or
    of another length, takes its row's) and, given `version`, loss mask 0 past ``staleness_limit``.
    """
    offsets, flat, _ = list_buffers(versions, "token_versions")
    flat = flat.astype(np.float64)
    keys = zip(
        versions.column("episode_id").to_numpy(zero_copy_only=False),
        versions.column("turn").to_numpy(zero_copy_only=False),
        strict=True,
    )
    by_turn = {(e, int(t)): flat[offsets[i] : offsets[i + 1]] for i, (e, t) in enumerate(keys)}
    episodes = table.column(algorithm_for(cfg).episode_column).to_numpy(zero_copy_only=False)
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


def scalar_rows(table: pa.Table) -> list[dict[str, Any]]:
    """A small query result as one dict per row; a LIST of numbers is refused."""
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

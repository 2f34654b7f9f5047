"""Fixtures of the agent tests: the default model's real tokenizer (prepared once, cached),
and what the trainer would forward of a run's turns."""

from __future__ import annotations

import asyncio

import duckdb
import pyarrow as pa
import pytest

from stacx.agents.chat import ChatFormat, ChatTokenizer
from stacx.train.packing import Sample


@pytest.fixture(scope="session")
def tokenizer() -> ChatTokenizer:
    from transformers import AutoTokenizer

    from stacx.hf import default_model_dir, find_default_gguf, is_prepared

    # The prepared checkpoint's tokenizer is the GGUF's, saved; either is the real one.
    if is_prepared(default_model_dir()):
        tok: ChatTokenizer = AutoTokenizer.from_pretrained(str(default_model_dir()))
    else:
        gguf = find_default_gguf()
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return tok


@pytest.fixture(scope="session")
def chat(tokenizer: ChatTokenizer) -> ChatFormat:
    return ChatFormat(tokenizer)


def trained_sequences(con: duckdb.DuckDBPyConnection) -> list[Sample]:
    """The sequences an sft trainer forwards for every turn of the run (the trainer's own read,
    ``stacx.train.batches.step_batch``: one per chain of each episode)."""
    from stacx.train.batches import step_batch
    from stacx.train.config import TrainerConfig

    async def query(sql: str, params: dict[str, object]) -> pa.Table:
        return con.sql(sql, params=params).to_arrow_table()

    eids = [e for (e,) in con.execute("select episode_id from episodes").fetchall()]
    cfg = TrainerConfig(algorithm="sft", filter="true")
    return asyncio.run(step_batch(cfg, query, eids)).samples

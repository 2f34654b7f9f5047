"""Imitation fixtures: the real default model (one engine per session) and its chat format."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from stacx.agents.chat import ChatFormat
from stacx.inference.torch_engine import TorchEngine
from tests.agents.conftest import chat, tokenizer

__all__ = ["chat", "tokenizer"]

BASIC = Path(__file__).resolve().parents[2] / "recipes" / "tasks" / "basic"


@pytest.fixture(scope="session")
def engine() -> Iterator[TorchEngine]:
    """The default model on CPU. Its worker thread is not bound to an event loop, so one engine
    serves every test's loop; it is closed at the end of the session."""
    eng = TorchEngine("default", device="cpu", max_batch=8, max_len=4096)
    yield eng
    asyncio.run(eng.close())


@pytest.fixture(scope="session")
def chat_format(chat: ChatFormat) -> ChatFormat:
    return chat


Query = Callable[[str], Awaitable[pa.Table]]


async def wait_for(query: Query, sql: str, want: int, timeout: float = 120.0) -> int:
    """Poll `sql` (a count) until it reaches `want`; returns the last count."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        n = int((await query(sql)).column(0)[0].as_py())
        if n >= want or loop.time() > deadline:
            return n
        await asyncio.sleep(0.2)

"""What the torch engine's worker thread keeps per request, and how results cross from that
thread to the caller's event loop (futures and stream queues are only touched in their loop)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from torch import nn

from stacx.inference.sampling import RowParams
from stacx.ports import Generation, SamplingParams

T = TypeVar("T")


@dataclass(eq=False)
class Request:
    """One prompt of a ``generate`` call, from submission to its Generation."""

    prompt: list[int]
    params: SamplingParams
    row: RowParams
    stop_ids: frozenset[int]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Generation]
    submitted: float
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    slot: int = -1
    admitted: float = 0.0
    cancelled: bool = False
    # a streamed request: called in `loop` with the ids (and logprobs) sampled since the last call
    on_tokens: Callable[[list[int], list[float]], None] | None = None
    streamed: int = 0  # output ids already handed to on_tokens
    # weight version change points: output[version_starts[i]:] came from versions[i] onwards
    version_starts: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    @property
    def cached(self) -> int:
        """Tokens whose keys are in the cache (all but the last sampled one)."""
        return len(self.prompt) + max(0, len(self.output) - 1)


Item = tuple[int, list[int], list[float]] | tuple[int, Request]  # a stream's queue: ids | done


def deliver(fut: asyncio.Future[T], value: T | BaseException) -> None:
    if fut.done():
        return
    if isinstance(value, BaseException):
        fut.set_exception(value)
    else:
        fut.set_result(value)


def post(loop: asyncio.AbstractEventLoop, fut: asyncio.Future[T], value: T | BaseException) -> None:
    try:
        loop.call_soon_threadsafe(deliver, fut, value)
    except RuntimeError:  # the caller's event loop is closed; nobody is waiting
        pass


def put_tokens(queue: asyncio.Queue[Item], i: int, ids: list[int], lps: list[float]) -> None:
    queue.put_nowait((i, ids, lps))


def put_done(queue: asyncio.Queue[Item], i: int, r: Request, _: object) -> None:
    queue.put_nowait((i, r))


def eos_ids(model: nn.Module, tokenizer: object) -> frozenset[int]:
    ids: set[int] = set()
    gen_cfg = getattr(model, "generation_config", None)
    eos = getattr(gen_cfg, "eos_token_id", None)
    ids.update([eos] if isinstance(eos, int) else (eos or []))
    tok_eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(tok_eos, int):
        ids.add(tok_eos)
    return frozenset(ids)

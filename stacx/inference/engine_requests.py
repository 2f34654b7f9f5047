"""What the torch engine's worker thread keeps per request, and how results cross from that
thread to the caller's event loop (futures and stream queues are only touched in their loop)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from torch import nn

from stacx.inference.guided import Guide
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
    next_turn: bool | None = None  # extends a held prompt (engine_admission.py); None: not tested
    # weight version change points: output[version_starts[i]:] came from versions[i] onwards
    version_starts: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    guide: Guide | None = (
        None  # its grammar's state (SamplingParams.grammar; stacx.inference.guided)
    )

    @property
    def cached(self) -> int:
        """Tokens whose keys are in the cache (all but the last sampled one)."""
        return len(self.prompt) + max(0, len(self.output) - 1)

    def generation(self, reason: str, version: int) -> Generation:
        """The result so far, finished for `reason` under weight `version`."""
        now = time.monotonic()
        admitted = self.admitted or now
        return Generation(
            output_ids=list(self.output),
            logprobs=list(self.logprobs),
            finish_reason=reason,
            weight_version=version,
            gen_ms=(now - admitted) * 1e3,
            queue_ms=(admitted - self.submitted) * 1e3,
            # change points only where a load fell inside the generation (compact, see ports)
            version_starts=list(self.version_starts) if len(self.versions) > 1 else [],
            versions=list(self.versions) if len(self.versions) > 1 else [],
        )


def new_request(
    prompt: list[int],
    params: SamplingParams,
    index: int,
    loop: asyncio.AbstractEventLoop,
    device: torch.device,
    eos: frozenset[int],
) -> Request:
    """Prompt `index` of a ``generate`` call: seed ``params.seed + index`` (else random, for a
    GPU draw's key); stop ids the params' plus EOS unless ``ignore_eos``."""
    gen = None
    if params.seed is not None and params.temperature > 0:
        gen = torch.Generator(device=device).manual_seed(params.seed + index)
    seed = params.seed + index if params.seed is not None else int(torch.randint(2**62, ()))
    stops = set(params.stop_token_ids) | (set() if params.ignore_eos else eos)
    return Request(
        prompt=list(prompt),
        params=params,
        row=RowParams(params.temperature, params.top_p, params.top_k, gen, seed),
        stop_ids=frozenset(stops),
        loop=loop,
        future=loop.create_future(),
        submitted=time.monotonic(),
    )


def hand_over(reqs: list[Request], owner: list[Request | None]) -> None:
    """Post each streamed, unfinished request's new ids to its loop (a finished one's come
    with its Generation); `owner`: the engine's rows (a request not in its row has ended)."""
    for r in reqs:
        if (
            r.on_tokens is not None
            and 0 <= r.slot
            and owner[r.slot] is r
            and len(r.output) > r.streamed
        ):
            ids, lps = r.output[r.streamed :], r.logprobs[r.streamed :]
            r.streamed = len(r.output)
            try:
                r.loop.call_soon_threadsafe(r.on_tokens, ids, lps)
            except RuntimeError:  # the caller's event loop is closed; nobody is waiting
                pass


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

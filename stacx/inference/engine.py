"""The Engine port: token ids in, token ids + logprobs + weight version out.

Every backend (in-process torch, SGLang server, OpenAI-compatible server, the `stacx serve`
HTTP front) implements this Protocol and passes the one contract suite in
tests/inference/test_engine_contract.py. Text appears only at the edges (chat templates in the
agent, the OpenAI routes of `stacx serve`).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import msgspec


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: no top-k
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False  # keep generating past EOS (stop_token_ids still stop); benchmarks


class Generation(msgspec.Struct, frozen=True, kw_only=True):
    output_ids: list[int]
    logprobs: list[float] | None  # log p(token) under the sampling distribution's model, one per id
    finish_reason: str  # "stop" (EOS or a stop token) | "length" | "abort"
    weight_version: int
    gen_ms: float = 0.0
    queue_ms: float = 0.0


@runtime_checkable
class Engine(Protocol):
    """A generator of token ids. Implementations must be safe to call concurrently."""

    name: str

    async def generate(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> list[Generation]: ...

    async def score(self, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
        """Logprob of each of `output_ids` given `prompt_ids` (teacher scoring, OPD)."""
        ...

    async def load_weights(self, path: str, version: int) -> None:
        """Load a safetensors checkpoint; later tokens carry `version`."""
        ...

    @property
    def weight_version(self) -> int: ...

    async def close(self) -> None: ...

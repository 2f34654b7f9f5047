"""An :class:`Engine` backed by any OpenAI-compatible ``/v1/completions`` server (teachers).

Prompts go as token ids and, with ``extensions`` (vLLM/SGLang extras), output ids come back
exactly; ``prompt_as_text`` (OpenAI itself) is not token-exact. ``load_weights`` raises.
Design: docs/engine.md#the-openai-client
"""

from __future__ import annotations

import asyncio

from stacx.errors import EngineError
from stacx.inference.http import HttpClient
from stacx.ports import ChatTokenizer, Generation, SamplingParams


class OpenAIEngine:
    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        tokenizer: ChatTokenizer | None = None,
        extensions: bool = True,
        prompt_as_text: bool = False,
        timeout_s: float | None = None,
        weight_version: int = 0,
    ) -> None:
        if prompt_as_text and tokenizer is None:
            raise EngineError("prompt_as_text needs a tokenizer to turn prompt ids into text")
        base = base_url.rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = HttpClient(base, headers=headers, timeout_s=timeout_s)
        self.model, self.tokenizer = model, tokenizer
        self.extensions, self.prompt_as_text = extensions, prompt_as_text
        self.weight_version = weight_version

    def _body(
        self, prompt: list[int], params: SamplingParams, **extra: object
    ) -> dict[str, object]:
        if params.grammar:
            raise EngineError(
                "constrained decoding (SamplingParams.grammar) is not supported by "
                "the OpenAI client engine"
            )
        body: dict[str, object] = {
            "model": self.model,
            "prompt": self.tokenizer.decode(prompt, skip_special_tokens=False)
            if self.prompt_as_text and self.tokenizer is not None
            else list(prompt),
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": 1,
        }
        if params.seed is not None:
            body["seed"] = params.seed
        if self.extensions:
            body.update(
                return_token_ids=True,
                return_tokens_as_token_ids=True,
                skip_special_tokens=False,
                stop_token_ids=list(params.stop_token_ids),
                top_k=params.top_k,
                ignore_eos=params.ignore_eos,
            )
        body.update(extra)
        return body

    def _output_ids(self, choice: dict[str, object]) -> list[int]:
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            return [int(t) for t in ids]
        lp = choice.get("logprobs")
        tokens = lp.get("tokens") if isinstance(lp, dict) else None
        if (
            isinstance(tokens, list)
            and tokens
            and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens)
        ):
            return [int(t.split(":", 1)[1]) for t in tokens]
        if self.tokenizer is not None:  # not token-exact: see the module docstring
            return list(
                self.tokenizer.encode(str(choice.get("text", "")), add_special_tokens=False)
            )
        raise EngineError("the server returned no output token ids; pass a tokenizer")

    async def _one(self, prompt: list[int], params: SamplingParams) -> Generation:
        answer = await self.http.request("POST", "/completions", self._body(prompt, params))
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise EngineError(f"unexpected /v1/completions answer: {str(answer)[:300]}")
        choice = choices[0]
        ids = self._output_ids(choice)
        lp = choice.get("logprobs")
        values = lp.get("token_logprobs") if isinstance(lp, dict) else None
        logprobs = [float(v) for v in values] if isinstance(values, list) else None
        if logprobs is not None and len(logprobs) != len(ids):
            logprobs = None  # re-derived ids (text mode) need not line up; better none than wrong
        reason = choice.get("finish_reason")
        version = choice.get("weight_version", self.weight_version)
        return Generation(
            output_ids=ids,
            logprobs=logprobs,
            finish_reason=str(reason) if reason in ("stop", "length") else "abort",
            weight_version=int(version) if isinstance(version, int) else self.weight_version,
        )

    async def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        return list(await asyncio.gather(*(self._one(p, params) for p in prompts)))

    async def score(self, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
        if not prompt_ids or not output_ids:
            raise EngineError("score needs a non-empty prompt and a non-empty output")
        ids = list(prompt_ids) + list(output_ids)
        params = SamplingParams(max_new_tokens=1, temperature=0.0)
        body = self._body(ids, params, echo=True)
        answer = await self.http.request("POST", "/completions", body, idempotent=True)  # a read
        try:
            values = answer["choices"][0]["logprobs"]["token_logprobs"]  # type: ignore[index]
            got = [float(v) for v in values[len(prompt_ids) : len(ids)]]
        except (KeyError, IndexError, TypeError) as e:
            raise EngineError(f"the server did not echo prompt logprobs: {e!r}") from e
        if len(got) != len(output_ids):
            raise EngineError(f"echoed {len(got)} logprobs for {len(output_ids)} scored ids")
        return got

    async def load_weights(self, path: str, version: int) -> None:
        raise EngineError("an OpenAI-compatible server's weights cannot be loaded from here")

    async def close(self) -> None:
        await self.http.close()
